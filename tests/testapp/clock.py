"""A simulated clock for schedule tests, shared with worker subprocesses through a file.

The file (JOBQUEUE_TEST_CLOCK_FILE) holds one segment of simulated time: from `sim` at the
real instant `real`, running `speed` times as fast as time, and standing still at `until`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path


def now() -> dt.datetime:
    """Return the simulated time now."""
    data = json.loads(Path(os.environ["JOBQUEUE_TEST_CLOCK_FILE"]).read_text())
    moment = dt.datetime.fromisoformat(data["sim"]) + dt.timedelta(
        seconds=(time.time() - data["real"]) * data["speed"]
    )
    if data.get("until"):
        moment = min(moment, dt.datetime.fromisoformat(data["until"]))
    return moment


def set_clock(
    path: Path, sim: dt.datetime, *, speed: float = 0.0, until: dt.datetime | None = None
) -> None:
    """Start a segment: `sim` now, running at `speed`, stopping at `until` (atomically)."""
    data = {
        "real": time.time(),
        "sim": sim.isoformat(),
        "speed": speed,
        "until": until.isoformat() if until else None,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
