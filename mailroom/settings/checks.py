"""Strictness for ``Settings``: unknown variables, unparsable JSON, template placeholders.

pydantic-settings reads only the variables that match a field and ignores every
other ``MAILROOM_*`` name, so a misspelt variable would silently keep its default.
``StrictEnvSource`` walks each prefixed variable down the model tree first and
refuses the ones that name nothing, and names the variable whose JSON is broken
(pydantic-settings only names the top-level field). Nested keys are refused by
``extra="forbid"`` on every model.
"""

from __future__ import annotations

import difflib
import json
import re
import string
import types
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_settings import EnvSettingsSource

from mailroom.errors import InvalidJsonSettingError, UnknownSettingError
from mailroom.settings.secret_files import FILE_SUFFIX, with_secret_files

PREFIX = "MAILROOM_"
DELIMITER = "__"


def _model(annotation: Any) -> type[BaseModel] | None:
    """The model class behind ``annotation`` (``Group`` or ``Group | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [m for m in map(_model, typing.get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


def _is_json(annotation: Any) -> bool:
    """Whether pydantic-settings parses a variable of this type as JSON."""
    if _model(annotation) is not None:
        return True
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(map(_is_json, args))
    return typing.get_origin(annotation) in (list, dict, set, tuple, frozenset)


def check_variable(model: type[BaseModel], name: str, value: str) -> None:
    """Raise if ``name`` (prefixed, any case) names no field of ``model`` or its JSON is broken."""
    path = name[len(PREFIX) :].lower().split(DELIMITER)
    current: type[BaseModel] | None = model
    for depth, part in enumerate(path):
        fields = current.model_fields if current is not None else {}
        if part not in fields:
            raise UnknownSettingError(
                f"{name.upper()} is not a setting{_hint(fields, path, depth)}; see the "
                "configuration reference (docs/pages/configuration.md)"
            )
        annotation = fields[part].annotation
        nested = _model(annotation)
        last = depth == len(path) - 1
        if last and _is_json(annotation):
            try:
                json.loads(value)
            except json.JSONDecodeError as exc:
                raise InvalidJsonSettingError(
                    f"{name.upper()} is not valid JSON ({exc.msg} at character {exc.pos})"
                ) from None
        if nested is None and not last:
            # Lists and mappings take their items' keys below (``…__ACCOUNTS__DEFAULT__URL``);
            # pydantic validates those, and refuses unknown ones through ``extra="forbid"``.
            if _is_json(annotation):
                return
            single = PREFIX + DELIMITER.join(path[: depth + 1]).upper()
            raise UnknownSettingError(f"{name.upper()} is not a setting: {single} takes one value")
        current = nested


def names_setting(model: type[BaseModel], name: str) -> bool:
    """Whether the variable ``name`` (prefixed) names a setting of ``model``.

    Walks into list items (by index) and mapping values (by any key), so
    ``…__WEBHOOK_ACCOUNTS__ERP__SECRETS`` names a setting and ``…__SECRETS_FILE`` does not.
    """
    annotation: Any = model
    for part in name[len(PREFIX) :].lower().split(DELIMITER):
        current = _model(annotation)
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if current is not None and part in current.model_fields:
            annotation = current.model_fields[part].annotation
        elif current is None and origin is list and args and part.isdigit():
            annotation = args[0]
        elif current is None and origin is dict and len(args) == 2:
            annotation = args[1]
        else:
            return False
    return True


def _item_keys(annotation: Any) -> list[str]:
    """The keys of the items of a list or mapping of models (``intake.mailboxes``)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    item = args[0] if origin is list and args else args[-1] if origin is dict and args else None
    model = _model(item)
    return list(model.model_fields) if model is not None else []


def _hint(fields: Mapping[str, Any], path: list[str], depth: int) -> str:
    """A likely meaning of ``path[depth:]``: a key of the group's items, or a close variable.

    The rest of the name is compared whole with every variable below the group, so a
    single underscore where ``__`` nests (``DATABASE_URL``) and a ``_FILE`` suffix are
    kept in the suggestion instead of being cut off.
    """
    part = path[depth]
    for field, info in fields.items():
        if part in _item_keys(info.annotation):
            variable = PREFIX + DELIMITER.join([*path[:depth], field]).upper()
            return f" ({part!r} is a key of each item of {variable})"
    rest = DELIMITER.join(path[depth:])
    names = [DELIMITER.join(names) for names in _variable_paths(fields)]
    if rest.endswith(FILE_SUFFIX.lower()):
        names += [name + FILE_SUFFIX.lower() for name in names]
    squeezed = {re.sub("_+", "_", name): name for name in names}
    close = squeezed.get(re.sub("_+", "_", rest)) or next(
        iter(difflib.get_close_matches(rest, names, n=1)), None
    )
    if close is None:
        return ""
    return f" (did you mean {PREFIX}{DELIMITER.join([*path[:depth], close]).upper()}?)"


def _variable_paths(fields: Mapping[str, Any]) -> Iterator[list[str]]:
    """The key paths of the settings below ``fields`` that take one value (or one JSON value)."""
    for name, info in fields.items():
        nested = _model(info.annotation)
        if nested is None:
            yield [name]
        else:
            for below in _variable_paths(nested.model_fields):
                yield [name, *below]


class StrictEnvSource(EnvSettingsSource):
    """The environment source, refusing ``MAILROOM_*`` variables that name no setting.

    Values may come from files (``MAILROOM_…_FILE``, ``MAILROOM_SECRETS_DIR``): see
    ``mailroom.settings.secret_files``; they are checked like variables.
    """

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return with_secret_files(
            super()._load_env_vars(),
            lambda name: names_setting(self.settings_cls, name),
            case_sensitive=self.case_sensitive,
        )

    def __call__(self) -> dict[str, Any]:
        for name, value in self.env_vars.items():
            if name.upper().startswith(PREFIX) and value is not None:
                check_variable(self.settings_cls, name, value)
        return super().__call__()


def variable_for(loc: Sequence[int | str], environ: Mapping[str, str]) -> str | None:
    """The set variable that supplied the value at ``loc`` (a validation error's location)."""
    names = []
    for part in loc:
        if not isinstance(part, str):
            break
        names.append(part.upper())
    set_names = {name.upper() for name in environ}
    for end in range(len(names), 0, -1):
        candidate = PREFIX + DELIMITER.join(names[:end])
        for name in (candidate, candidate + "_FILE"):
            if name in set_names:
                return name
    return None


def variable_named(loc: Sequence[int | str]) -> str:
    """The variable that sets the value at ``loc`` (list items are set with their list)."""
    names = []
    for part in loc:
        if not isinstance(part, str):
            break
        names.append(part.upper())
    return PREFIX + DELIMITER.join(names)


#: A dotted settings path in a message (``delivery.webhook_allowed_hosts``), not inside quotes.
_DOTTED_PATH = re.compile(r"(?<![\w.'\"/])([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+)(?![\w'\"/])")
#: The settings path a message starts with (``webhook_accounts.a: …``, ``ca_file '…'``).
_LEADING_PATH = re.compile(r"([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*)[: ]")


def with_variables(model: type[BaseModel], message: str) -> str:
    """``message`` with each dotted path naming a setting of ``model`` replaced by its variable.

    Paths through list items (``delivery.routes.0``) are locations, not variables: kept.
    """

    def replace(match: re.Match[str]) -> str:
        parts = match.group(1).split(".")
        if any(part.isdigit() for part in parts):
            return match.group(1)
        name = PREFIX + DELIMITER.join(parts).upper()
        return name if names_setting(model, name) else match.group(1)

    return _DOTTED_PATH.sub(replace, message)


def location_of(
    model: type[BaseModel], loc: Sequence[int | str], message: str
) -> tuple[int | str, ...]:
    """``loc`` extended by the settings path ``message`` starts with, if it names one below it."""
    match = _LEADING_PATH.match(message)
    if match is not None:
        for start in (tuple(loc), ()):
            parts = (*start, *match.group(1).split("."))
            if names_setting(model, PREFIX + DELIMITER.join(map(str, parts)).upper()):
                return tuple(int(p) if isinstance(p, str) and p.isdigit() else p for p in parts)
    return tuple(loc)


def keys_at(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys the model at ``loc`` (through groups, list items and mapping values) takes."""
    annotation: Any = model
    for part in loc:
        current = _model(annotation)
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if current is not None and isinstance(part, str) and part in current.model_fields:
            annotation = current.model_fields[part].annotation
        elif origin is list and args:
            annotation = args[0]
        elif origin is dict and len(args) == 2:
            annotation = args[1]
        else:
            return []
    current = _model(annotation)
    return list(current.model_fields) if current is not None else []


def unknown_placeholders(template: str, known: Iterable[str]) -> list[str]:
    """Placeholders of a ``str.format`` template that are not in ``known``.

    Raises:
        ValueError: the template is malformed (a lone brace, an empty ``{}``).
    """
    allowed = set(known)
    unknown = []
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        # ``{mail_subject!r:.20}`` and ``{summary.attr}`` are rooted at the leading name.
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ValueError(f"positional placeholder {{{field}}}; name one of {sorted(allowed)}")
        if root not in allowed:
            unknown.append(root)
    return unknown
