"""The error tree drawn in ``mailroom/errors.py``'s docstring is the tree of the classes.

Every exception class the product defines (``mailroom``, ``actors``, ``bridges``,
``scheduling``; not the tooling in ``mailroom.devtools``) is reachable from
``mailroom.errors``, and each one's parent is the one drawn.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mailroom.errors
from mailroom.errors import AppError

ROOT = Path(__file__).resolve().parents[2]

#: One class per line of the drawing: box-drawing prefix, the name, then a comment if any.
_LINE = re.compile(r"^(?P<prefix>[ │├└─]*)(?P<name>[A-Za-z_][\w.]*)(?:\s{2,}\(.*\))?$")

#: Imports every module of the product in a fresh interpreter (the test process keeps its own
#: imports and logging) and prints each exception class defined there with its parent.
_SCAN = """
import importlib, inspect, json, pkgutil
found = {}
for package in ("mailroom", "actors", "bridges", "scheduling"):
    root = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".")]
    for name in names:
        if name.endswith(".__main__") or name.startswith("mailroom.devtools"):
            continue
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == name):
                found[obj.__qualname__] = [name, obj.__bases__[0].__qualname__]
print(json.dumps(found))
"""


def drawn_tree() -> dict[str, str]:
    """``{class name: parent name}`` as the docstring draws it (roots have no entry)."""
    doc = mailroom.errors.__doc__ or ""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for raw in doc.splitlines():
        if not raw.startswith("    ") or not raw.strip():
            stack = [] if not raw.strip() else stack
            continue
        match = _LINE.match(raw[4:])
        assert match, f"not a line of the tree: {raw!r}"
        depth = len(match["prefix"])
        name = match["name"].rsplit(".", 1)[-1]
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            assert name not in parents, f"{name} is drawn twice"
            parents[name] = stack[-1][1]
        stack.append((depth, name))
    return parents


def defined_exceptions() -> dict[str, tuple[str, str]]:
    """``{class name: (module, parent name)}`` for every exception the product defines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env["MAILROOM_BROKER__KIND"] = "stub"
    done = subprocess.run(
        [sys.executable, "-c", _SCAN],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return {name: (module, parent) for name, (module, parent) in json.loads(done.stdout).items()}


def app_error_subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | app_error_subclasses(sub)
    return found


def test_every_app_error_is_drawn_under_its_parent():
    drawn = drawn_tree()
    actual = {cls.__name__: cls.__bases__[0].__name__ for cls in app_error_subclasses(AppError)}
    assert actual, "AppError has no subclasses: the walk found nothing"
    assert {name: drawn.get(name) for name in actual} == actual


def test_every_exception_of_the_product_is_in_the_tree_of_errors_py():
    drawn = drawn_tree()
    defined = defined_exceptions()
    assert "AppError" in defined and "WebhookVerificationError" in defined

    outside = {
        name: module
        for name, (module, _) in defined.items()
        if getattr(mailroom.errors, name, None) is None
    }
    assert outside == {}, "defined outside mailroom.errors and not re-exported there"
    roots = {"AppError", "SettingsError", "ValueError"}
    actual = {name: parent for name, (_, parent) in defined.items() if name not in roots}
    assert actual == {name: parent for name, parent in drawn.items() if name not in roots}


def test_transient_conditions_are_retryable():
    # A lock or lease someone else holds goes away by itself: the same call succeeds later.
    assert issubclass(mailroom.errors.CursorBusy, mailroom.errors.RetryableError)
    assert issubclass(mailroom.errors.ReviewConflict, mailroom.errors.RetryableError)
