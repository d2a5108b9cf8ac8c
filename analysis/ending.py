"""How a run ended: closed, still running, or ended without closing (SPEC §6).

A process that stops stepscope (``stepscope.stop()``, the interpreter's exit)
writes the trace's END chunk, its ``process.json`` ``end_time`` and, for the
run's first process, ``run.json``'s. One that leaves through ``os._exit``, a
SIGKILL or an out-of-memory kill writes none of them, and the events of its
last flush interval (``STEPSCOPE_FLUSH_MS``, run.json's ``config``) are lost:
the summary, the report and ``diff`` must not present such a run as complete.
A run still being written looks the same on disk, so each unclosed process is
checked against this host's live processes (pid and start time, which together
name one process for the life of the machine).

Only the run's training processes (``origin: main``) decide: a DataLoader or
``multiprocessing`` worker terminated by its parent is how those workers end.
"""

from __future__ import annotations

import os
from typing import List, Optional

from stepscope.core import runinfo

CLOSED, RUNNING, NOT_CLOSED, UNKNOWN = "closed", "running", "not_closed", "unknown"
# /proc's start time has clock-tick resolution, and process.json rounds it: one that
# differs by more is another process that reused the pid.
START_TIME_TOLERANCE_S = 1.0
DEFAULT_FLUSH_MS = 1000  # config.flush_interval_ms when run.json does not say


def process_alive(pid, host, start_time) -> Optional[bool]:
    """Whether the process that wrote a process.json still runs: None when it ran on
    another host (this one cannot tell), else whether a process with its pid and start
    time lives here."""
    if host not in (runinfo.hostname(),) or not isinstance(pid, int):
        return None
    started = runinfo.process_start_time(pid)
    if started is None:
        return False
    if not isinstance(start_time, (int, float)):
        return True  # an older process.json without its start time: the pid alone
    return abs(started - float(start_time)) <= START_TIME_TOLERANCE_S


def _closed(proc) -> bool:
    return bool(proc.clean_close) and proc.meta.get("end_time") is not None


def _state(proc) -> str:
    if _closed(proc):
        return CLOSED
    m = proc.meta
    alive = process_alive(m.get("pid"), m.get("host"), m.get("process_start_time"))
    return UNKNOWN if alive is None else RUNNING if alive else NOT_CLOSED


def run_ending(run) -> dict:
    """``complete`` (every training process closed), ``state`` (``closed``; ``running``: a
    process is alive; ``unknown``: one ran on another host; ``not_closed``), the unclosed processes
    (``process``, ``pid``, ``host``, ``state``), ``flush_interval_ms`` and, when not
    closed, ``message``: the warning the summary, report and diff print."""
    procs = [p for p in getattr(run, "_procs", []) if p.meta.get("origin", "main") == "main"]
    flush_ms = int((run.info.get("config") or {}).get("flush_interval_ms") or DEFAULT_FLUSH_MS)
    if not procs:  # no training process folder: run.json alone says
        state = CLOSED if run.info.get("end_time") or not run.info else NOT_CLOSED
        unclosed: List[dict] = []
    else:
        unclosed = [{"process": os.path.basename(p.folder), "pid": p.meta.get("pid"), "host": p.meta.get("host"),
                     "state": _state(p)} for p in procs if not _closed(p)]
        states = {u["state"] for u in unclosed}
        state = next((s for s in (RUNNING, UNKNOWN, NOT_CLOSED) if s in states), CLOSED)
    out = {"complete": state == CLOSED, "state": state, "processes": unclosed, "flush_interval_ms": flush_ms}
    if state != CLOSED:
        out["message"] = ending_message(out)
    return out


def _who(unclosed: List[dict]) -> str:
    names = [u["process"] for u in unclosed]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def ending_message(ending: dict) -> str:
    """One line on a run that did not close."""
    flush = f"{ending['flush_interval_ms']} ms, STEPSCOPE_FLUSH_MS"
    if ending["state"] == RUNNING:
        live = [u for u in ending["processes"] if u["state"] == RUNNING]
        return (f"the run is still running ({_who(live)}): what it recorded in its last flush interval "
                f"({flush}) and after is not written yet")
    if ending["state"] == UNKNOWN:
        away = [u for u in ending["processes"] if u["state"] == UNKNOWN]
        hosts = ", ".join(sorted({str(u["host"]) for u in away}))
        return (f"the run did not close ({_who(away)}): it is still running on {hosts}, or ended there without "
                f"closing and lost up to its last flush interval ({flush}) of events; this host cannot tell")
    who = f" ({_who(ending['processes'])})" if ending["processes"] else ""
    return (f"the run ended without closing{who}: its process exited without stopping stepscope (os._exit, "
            f"SIGKILL, an out-of-memory kill), so up to its last flush interval ({flush}) of events is missing: the "
            "steps and their times stop short of its end")


def frameworks_known(run, ending: dict) -> bool:
    """Whether the run's imported frameworks are known: stepscope records them when a
    process closes (run.json's and process.json's ``versions``)."""
    return ending["complete"] or bool(run.versions)
