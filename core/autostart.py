"""Zero-edit start: ``STEPSCOPE=1 python train.py``.

Imported at interpreter start by the ``stepscope.pth`` file that the wheel
installs (and by the ``sitecustomize`` that ``stepscope run`` puts on
PYTHONPATH), only when ``STEPSCOPE`` is set. Runs once per process however
often it is imported. Frameworks are instrumented right after the script
imports them (the ``stepscope.instrumentors`` entry points, core/plugins.py),
never imported here. Bad settings or any failure print one
warning; the program always runs.
"""

from __future__ import annotations

import sys


def _instrument_frameworks_when_imported() -> None:
    """The startup plugins run now; each registered instrumentor is loaded and
    turned on right after the module it names is imported (never before:
    `import stepscope` stays light)."""
    from stepscope.core import plugins, safety

    for ep, set_up in plugins.load_group(plugins.STARTUP):
        try:
            set_up()
        except Exception as exc:  # noqa: BLE001
            safety.warn_once(f"startup:{ep.name}", f"stepscope: {ep.name} was not set up ({exc})")
    plugins.instrument_when_imported()


def main() -> None:
    try:
        from stepscope.core import config

        if not config.flag("STEPSCOPE"):
            return
        from stepscope.core import safety, session

        session.join_parent_run_if_any()  # a child of a profiled process joins its run here
        if session.current() is None:
            try:
                config.resolve()
            except config.ConfigError as exc:
                safety.report_failure(f"invalid setting ({exc})")
                return
            if session.start() is None:
                return
        _instrument_frameworks_when_imported()
    except Exception as exc:  # noqa: BLE001
        try:
            print(f"stepscope: could not start ({type(exc).__name__}: {exc}); "
                  "the program continues unprofiled", file=sys.stderr)
        except Exception:  # noqa: BLE001 - a broken stderr must not stop the program either
            pass


main()
