"""Never break the job: stepscope's failures become one line on stderr.

Anything that goes wrong inside stepscope while it runs in a user's process
is reported once and switches profiling off; the user's program carries on
with the same results.
"""

from __future__ import annotations

import functools
import sys
import threading

_lock = threading.Lock()
_reported = False
# What turns recording off after a failure: the session module registers its switch
# here when it is imported (this module imports nothing of stepscope's above it).
_switches_off: list = []


def on_failure(switch_off) -> None:
    """``switch_off()`` runs at every reported failure (it must be idempotent)."""
    _switches_off.append(switch_off)


def report_failure(what: str, exc: BaseException | None = None) -> None:
    """Prints one warning per process and turns recording off."""
    global _reported
    with _lock:
        first = not _reported
        _reported = True
    for switch_off in list(_switches_off):
        try:
            switch_off()
        except Exception:  # noqa: BLE001 - turning recording off must not fail into the program
            pass
    if first and not _native_reported():
        detail = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        try:
            print(f"stepscope: {what}{detail}; profiling is turned off, the program continues unaffected",
                  file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - a broken stderr must not break the program
            pass


def _native_reported() -> bool:
    """The native writer printed its own line for this failure (a write that failed:
    csrc/record/writer.cc), and a failure after it (process.json on the same full disk) is
    the same failure: one line is enough."""
    try:
        from stepscope.core import _native

        return bool(_native.stats().get("error"))
    except Exception:  # noqa: BLE001
        return False


_warned: set = set()


def warn_once(key: str, message: str) -> None:
    """One line on stderr per key and process, for what stepscope skips while
    it keeps recording (an integration for an unknown version, a profiler in use)."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    try:
        print(message, file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - a broken stderr must not break the program
        pass


def reset() -> None:
    """Forget an earlier report (tests, and a forked child's fresh start)."""
    global _reported
    _reported = False


def guarded(what: str, default=None):
    """Decorator: failures of the wrapped stepscope function are reported, not raised."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the point is to catch everything
                report_failure(what, exc)
                return default

        return inner

    return wrap
