"""Make this process's wall clock run JOBQUEUE_CHAOS_CLOCK_OFFSET seconds ahead.

Put this directory on PYTHONPATH: Python imports `sitecustomize` at start-up, before Django or
the queue, so every later `time.time()`, `datetime.now()`, `datetime.utcnow()` and
`date.today()` is skewed, as on a host whose clock drifted. The monotonic clock is left
alone, as a wall-clock step leaves it.
"""

from __future__ import annotations

import datetime as _dt
import os
import time as _time

OFFSET = float(os.environ.get("JOBQUEUE_CHAOS_CLOCK_OFFSET", "0"))
_real_time, _real_time_ns = _time.time, _time.time_ns
_RealDatetime, _RealDate = _dt.datetime, _dt.date


def _time_ahead() -> float:
    return _real_time() + OFFSET


def _time_ns_ahead() -> int:
    return _real_time_ns() + int(OFFSET * 1e9)


class _DatetimeMeta(type):
    # Datetimes made elsewhere (database drivers, C code) are real ones: still datetimes.
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _RealDatetime)


class _SkewedDatetime(_RealDatetime, metaclass=_DatetimeMeta):
    @classmethod
    def now(cls, tz=None):  # type: ignore[no-untyped-def, override]
        return _RealDatetime.now(tz) + _dt.timedelta(seconds=OFFSET)

    @classmethod
    def utcnow(cls):  # type: ignore[no-untyped-def, override]
        return _RealDatetime.now(_dt.UTC).replace(tzinfo=None) + _dt.timedelta(seconds=OFFSET)

    @classmethod
    def today(cls):  # type: ignore[no-untyped-def, override]
        return cls.now()


if OFFSET:
    _time.time, _time.time_ns = _time_ahead, _time_ns_ahead
    _dt.datetime = _SkewedDatetime  # type: ignore[misc]
