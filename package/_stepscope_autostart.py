"""Interpreter-startup entry for zero-edit use (STEPSCOPE=1).

Run by ``stepscope.pth`` (an ``import`` line), by ``stepscope.start`` on
Python 3.15+ (PEP 829, which then skips the .pth import line) and by the
``sitecustomize`` of ``stepscope run``; it acts once per process. Costs one
environment lookup when STEPSCOPE is not set; imports stepscope only when it is.
"""

import os

_done = False


def main() -> None:
    global _done
    if _done or os.environ.get("STEPSCOPE", "").strip().lower() in ("", "0", "false", "no", "off"):
        return
    _done = True
    try:
        import stepscope.core.autostart  # noqa: F401 - starts once per process
    except BaseException as exc:  # noqa: BLE001 - never stop the interpreter from starting
        # Most likely the native module cannot be loaded (ImportError naming the fix).
        try:
            import sys

            print(f"stepscope: not profiling ({type(exc).__name__}: {exc}); the program runs unprofiled",
                  file=sys.stderr, flush=True)
        except BaseException:  # noqa: BLE001
            pass
