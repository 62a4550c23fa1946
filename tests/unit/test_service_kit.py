"""The service kit (``mailroom.service``) depends on nothing of Mailroom but the contract models.

import-linter enforces it (pyproject.toml); this test keeps that contract's list whole, so a
module added to Mailroom is forbidden to the kit until someone decides otherwise.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What the kit may import: itself, the contract's models and the packages above them.
ALLOWED = {
    "mailroom",
    "mailroom.service",
    "mailroom.recognition",
    "mailroom.recognition.contract",
    "mailroom.recognition.contract.models",
}


def _kit_contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c.get("source_modules") == ["mailroom.service"]
    ]
    return contract


def _modules(package: str, path: list[str]) -> set[str]:
    return {f"{package}.{m.name}" for m in pkgutil.iter_modules(path) if m.name != "__main__"}


def test_the_kit_contract_forbids_every_other_module_of_mailroom():
    import mailroom.recognition
    import mailroom.recognition.contract as contract

    everything = (
        _modules("mailroom", list(mailroom.__path__))
        | _modules("mailroom.recognition", list(mailroom.recognition.__path__))
        | _modules("mailroom.recognition.contract", list(contract.__path__))
    )
    unlisted = everything - ALLOWED - set(_kit_contract()["forbidden_modules"])
    assert not unlisted, (
        f"{sorted(unlisted)}: add to the kit's forbidden modules in pyproject.toml (or to "
        "ALLOWED here if it is part of the contract a partner's service needs and imports "
        "nothing else of Mailroom)"
    )


def test_the_kit_imports_nothing_of_mailroom_but_the_contract_models():
    code = (
        "import sys, mailroom.service; "
        "print('\\n'.join(m for m in sys.modules if m.startswith('mailroom')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    assert {m for m in loaded if not m.startswith("mailroom.service.")} <= ALLOWED
