"""Zero-edit start: ``STEPSCOPE=1 python train.py``.

Imported at interpreter start by the ``stepscope.pth`` file that the wheel
installs (and by the ``sitecustomize`` that ``stepscope run`` puts on
PYTHONPATH), only when ``STEPSCOPE`` is set. Runs once per process however
often it is imported. Frameworks are instrumented right after the script
imports them (the ``stepscope_instrumentor`` entry points), never imported
here. Bad settings or any failure print one
warning; the program always runs.
"""

from __future__ import annotations

import sys


INSTRUMENTORS = "stepscope_instrumentor"  # entry-point group: module name -> instrumentor object
STARTUP = "stepscope_startup"  # entry-point group: callables run once at zero-edit start


def _entry_points(group: str):
    from importlib.metadata import entry_points

    try:
        return list(entry_points(group=group))
    except TypeError:  # Python 3.9: entry_points() is a dict of groups
        return list(entry_points().get(group, ()))


def _instrument_frameworks_when_imported() -> None:
    """Each registered instrumentor is loaded and turned on right after the
    module it names is imported (never before: `import stepscope` stays light)."""
    from stepscope.core import importhook, safety

    for ep in _entry_points(STARTUP):
        try:
            ep.load()()
        except Exception as exc:  # noqa: BLE001
            safety.warn_once(f"startup:{ep.name}", f"stepscope: {ep.name} was not set up ({exc})")
    for ep in _entry_points(INSTRUMENTORS):
        importhook.when_imported(ep.name, lambda module, ep=ep: ep.load().on_import(module))


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
