"""Process identity: telling, on this host, that a worker's process is provably gone.

A worker writes in its row who its process is: `<boot id>:<pid namespace>:<pid>:<start>`, where
`start` is the process's start time in clock ticks since boot (the 22nd field of
`/proc/<pid>/stat`). Another worker that sees the same boot and the same pid namespace (the
same host, since its last boot, and the same view of its processes) can prove that process
gone: `/proc/<pid>` no longer exists, or it belongs to a process that started at another tick
(the pid was reused). Such a worker's jobs cannot be running anywhere, so they may be taken
back at once instead of a lease TTL later.

Nothing here uses a clock, and anything that cannot be proven counts as alive: another host,
another boot, another pid namespace (a container, even one sharing the host's network and
name), a platform without Linux's `/proc` or a `/proc` that hides other users' processes
(`hidepid`: the identity is then ""), a process that exists with the same start. Those wait
for their lease, as before.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

PROC = Path("/proc")


def _start_ticks(pid: int) -> int | None:
    """The start of process `pid` in clock ticks since boot, or None if there is no such pid."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the fields after its
    # last ")" start at field 3, so field 22 is the 20th of them.
    return int(stat[stat.rindex(")") + 2 :].split()[19])


@functools.cache
def host() -> str:
    """`<boot id>:<pid namespace>` of this process's view of the host, or "" if it cannot tell.

    "" also where `/proc` shows another pid namespace than this process's own (it would name
    other processes by the same pids).
    """
    try:
        boot = (PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(PROC / "self/ns/pid")
        if _start_ticks(os.getpid()) is None or _hides_pids():
            return ""
    except (OSError, ValueError, IndexError):
        return ""
    return f"{boot}:{namespace}"


def _hides_pids() -> bool:
    """Whether `/proc` is mounted with `hidepid`: another user's live process would look gone."""
    for line in (PROC / "self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[1] == str(PROC):
            options = dict(opt.partition("=")[::2] for opt in fields[3].split(","))
            if options.get("hidepid", "0") not in ("0", "off"):
                return True
    return False


def identity() -> str:
    """This process's identity for its worker row, or "" where it cannot be told."""
    here = host()
    if not here:
        return ""
    pid = os.getpid()
    return f"{here}:{pid}:{_start_ticks(pid)}"


def gone(process: str) -> bool:
    """Whether the process of identity `process` is provably not running (see the module)."""
    here = host()
    if not here or not process.startswith(here + ":"):
        return False
    try:
        pid_text, start_text = process[len(here) + 1 :].split(":")
        pid, start = int(pid_text), int(start_text)
    except ValueError:
        return False
    try:
        now = _start_ticks(pid)
    except (OSError, ValueError, IndexError):
        return False  # unreadable (permissions, a racing exit): not a proof
    return now is None or now != start
