"""`stepscope run` puts this folder first on PYTHONPATH: start stepscope, then
run the sitecustomize that would have run without us, if there is one."""

import os
import sys

try:
    import _stepscope_autostart  # installed beside stepscope; acts once even if the .pth ran
except ImportError:  # stepscope reached through PYTHONPATH, not installed
    try:
        import stepscope.core.autostart  # noqa: F401
    except Exception:  # noqa: BLE001 - never stop the interpreter from starting
        pass
else:
    _stepscope_autostart.main()


def _chain() -> None:
    import importlib.machinery

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.origin and os.path.isfile(spec.origin):
            with open(spec.origin, "rb") as f:
                code = compile(f.read(), spec.origin, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": spec.origin})
            return


_chain()
