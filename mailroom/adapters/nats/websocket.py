"""nats-py without aiohttp until a websocket link needs it.

nats-py's transport module imports aiohttp (and multidict) wherever it is installed, for
its websocket transport (``ws://``, ``wss://`` servers). Importing aiohttp costs about
0.2-0.3 s of CPU (its SSL contexts, its tracing classes) at the start of every process
that talks to NATS, though the webhook channel is its only other user. ``import_nats``
imports the transport with aiohttp kept out, then gives it stand-ins that import the
real modules when a websocket transport first uses them.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

TRANSPORT = "nats.aio.transport"
#: The modules nats-py's transport imports for its websocket transport only.
WEBSOCKET_MODULES = ("aiohttp", "multidict")


class ModuleOnUse:
    """Stands for a module in nats-py's transport module: imports it when first used."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __bool__(self) -> bool:
        return True  # the websocket transport refuses to start ``if not aiohttp``

    def __getattr__(self, attribute: str) -> Any:
        module = importlib.import_module(self._name)
        setattr(sys.modules[TRANSPORT], self._name, module)
        return getattr(module, attribute)


def import_nats() -> None:
    """Import nats-py's transport without aiohttp, unless aiohttp is loaded already."""
    if TRANSPORT in sys.modules or "aiohttp" in sys.modules:
        return
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # ``import aiohttp`` fails
    try:
        transport = importlib.import_module(TRANSPORT)
    finally:
        del sys.modules["aiohttp"]
    for name in WEBSOCKET_MODULES:
        if getattr(transport, name, None) is None:
            setattr(transport, name, ModuleOnUse(name))
