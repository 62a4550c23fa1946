"""Moves this process's wall clock by ``SHIFTED_CLOCK_S`` seconds (fault tests only).

Python imports ``sitecustomize`` at start-up from the first folder on its path
that has one; a fault test puts this folder first on ``PYTHONPATH`` of the one
process whose clock it shifts. Shifted: ``time.time``/``time.time_ns`` and
``datetime.now``/``utcnow``/``today`` (monotonic clocks stay as they are, as
they do when a real machine's clock is wrong). ``datetime`` is replaced by a
subclass before anything imports it, so ``from datetime import datetime``
gets the shifted one; its metaclass keeps ``isinstance`` true for the real
datetimes that drivers return.
"""

from __future__ import annotations

import datetime as _datetime_module
import os
import time

_SHIFT_S = float(os.environ.get("SHIFTED_CLOCK_S", "0") or 0)

if _SHIFT_S:
    _real_datetime = _datetime_module.datetime
    _real_time = time.time
    _real_time_ns = time.time_ns
    _shift = _datetime_module.timedelta(seconds=_SHIFT_S)

    def _time() -> float:
        return _real_time() + _SHIFT_S

    def _time_ns() -> int:
        return _real_time_ns() + int(_SHIFT_S * 1_000_000_000)

    class _Real(type):
        def __instancecheck__(cls, instance: object) -> bool:
            return isinstance(instance, _real_datetime)

        def __subclasscheck__(cls, subclass: type) -> bool:
            return issubclass(subclass, _real_datetime)

    class _ShiftedDatetime(_real_datetime, metaclass=_Real):
        # No instance dict: C extensions that check datetime's size at import stay quiet.
        __slots__ = ()

        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def, override]
            return _real_datetime.now(tz) + _shift

        @classmethod
        def utcnow(cls):  # type: ignore[no-untyped-def, override]
            return _real_datetime.now(_datetime_module.UTC).replace(tzinfo=None) + _shift

        @classmethod
        def today(cls):  # type: ignore[no-untyped-def, override]
            return _real_datetime.now() + _shift

    time.time = _time
    time.time_ns = _time_ns
    _datetime_module.datetime = _ShiftedDatetime  # type: ignore[misc]
