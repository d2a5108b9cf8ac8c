"""Zero-edit start: ``STEPSCOPE=1 python train.py``.

Imported at interpreter start by the ``stepscope.pth`` file that the wheel
installs (and by the ``sitecustomize`` that ``stepscope run`` puts on
PYTHONPATH), only when ``STEPSCOPE`` is set. Runs once per process however
often it is imported. Frameworks are instrumented right after the script
imports them, never imported here. Bad settings or any failure print one
warning; the program always runs.
"""

from __future__ import annotations

import os
import sys


def _enabled(value: str) -> bool:
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def _instrument_frameworks_when_imported() -> None:
    from stepscope.integrations import _importhook
    from stepscope.integrations import keras as keras_integration
    from stepscope.integrations import lightning as lightning_integration
    from stepscope.integrations import tfdata as tfdata_integration
    from stepscope.integrations import torch as torch_integration

    _importhook.when_imported("torch", torch_integration._on_import)
    _importhook.when_imported("lightning", lightning_integration._on_import)
    _importhook.when_imported("pytorch_lightning", lightning_integration._on_import)
    _importhook.when_imported("tensorflow", tfdata_integration._on_import)
    _importhook.when_imported("keras", keras_integration._on_import)


def main() -> None:
    try:
        if not _enabled(os.environ.get("STEPSCOPE", "")):
            return
        import stepscope  # noqa: F401 - a child of a profiled process joins its run here
        from stepscope.core import config, safety, session

        if session.current() is None:
            try:
                config.resolve()
            except config.ConfigError as exc:
                safety.report_failure(f"invalid setting ({exc})")
                return
            if session.start() is None:
                return
        from stepscope.compat import smppy

        smppy.install_import_alias()
        _instrument_frameworks_when_imported()
    except Exception as exc:  # noqa: BLE001
        try:
            print(f"stepscope: could not start ({type(exc).__name__}: {exc}); "
                  "the program continues unprofiled", file=sys.stderr)
        except Exception:
            pass


main()
