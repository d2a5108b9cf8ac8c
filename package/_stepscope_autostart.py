"""Interpreter-startup entry for zero-edit use (STEPSCOPE=1).

Run by ``stepscope.pth`` (an ``import`` line) and, on Python 3.15+, by
``stepscope.start`` (PEP 829, which then skips the .pth import line). Costs
one environment lookup when STEPSCOPE is not set; imports stepscope only
when it is.
"""

import os


def main() -> None:
    if os.environ.get("STEPSCOPE", "").strip().lower() in ("", "0", "false", "no", "off"):
        return
    try:
        import stepscope.core.autostart  # noqa: F401 - starts once per process
    except Exception:  # noqa: BLE001 - never stop the interpreter from starting
        pass
