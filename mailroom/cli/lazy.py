"""Subcommands whose modules are imported only when they are used (or listed by ``--help``).

Every Mailroom process starts through this CLI: ``mailroom worker`` runs Dramatiq's main
after reading its settings, the bridges and the scheduler run one command each. Importing every
operator command's module first (SQLAlchemy, Redis, NATS, the models, rich tables) cost each
of them about a second of CPU before its own work.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, ClassVar

import typer
import typer.main
from typer.core import TyperGroup

if TYPE_CHECKING:
    # Typer carries its own copy of click: its commands are not the click package's.
    from typer._click import Command


def load_command(name: str, target: str) -> Command:
    """The click command of ``module:attribute``: a Typer app (a group) or a command function."""
    module, _, attribute = target.partition(":")
    found = getattr(importlib.import_module(module), attribute)
    if isinstance(found, typer.Typer):
        command: Command = typer.main.get_group(found)
    else:
        single = typer.Typer(add_completion=False)
        single.command(name)(found)
        command = typer.main.get_command(single)
    command.name = name
    return command


class LazyCommands(MutableMapping[str, "Command"]):
    """A group's commands by name, in help order; a lazy one is loaded when first looked up."""

    def __init__(
        self, before: dict[str, str], loaded: dict[str, Command], after: dict[str, str]
    ) -> None:
        self._order = [*before, *loaded, *after]
        self._targets = {**before, **after}
        self._loaded = dict(loaded)

    def __getitem__(self, name: str) -> Command:
        if name not in self._loaded:
            if name not in self._targets:
                raise KeyError(name)
            self._loaded[name] = load_command(name, self._targets[name])
        return self._loaded[name]

    def __setitem__(self, name: str, command: Command) -> None:
        if name not in self._order:
            self._order.append(name)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        self._order.remove(name)
        self._targets.pop(name, None)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._order


class LazyGroup(TyperGroup):
    """A Typer group with lazy commands listed before and after those registered on its app.

    Subclasses name them as ``module:attribute`` (a Typer app or a command function).
    """

    lazy_before: ClassVar[dict[str, str]] = {}
    lazy_after: ClassVar[dict[str, str]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(self.lazy_before, dict(self.commands), self.lazy_after)
