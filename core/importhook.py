"""Run a callback right after a module is imported, without importing it.

Zero-edit mode patches frameworks the moment the user's script imports them
(never earlier, so `import stepscope` stays light).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Callable, Dict, List

_callbacks: Dict[str, List[Callable]] = {}
_busy = threading.local()
_finder = None


def when_imported(name: str, callback: Callable) -> None:
    """callback(module) now if `name` is imported, else right after its import."""
    if name in sys.modules:
        _run(name, sys.modules[name], [callback])
        return
    _callbacks.setdefault(name, []).append(callback)
    global _finder
    if _finder is None:
        _finder = _PostImportFinder()
        sys.meta_path.insert(0, _finder)


def _run(name, module, callbacks):
    from stepscope.core import safety

    for cb in callbacks:
        try:
            cb(module)
        except Exception as exc:  # noqa: BLE001
            safety.report_failure(f"instrumenting {name} failed", exc)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _callbacks or getattr(_busy, fullname, False):
            return None
        setattr(_busy, fullname, True)
        try:
            spec = importlib.util.find_spec(fullname)
        except (ImportError, ValueError):
            return None
        finally:
            setattr(_busy, fullname, False)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _NotifyingLoader(spec.loader, fullname)
        return spec


class _NotifyingLoader(importlib.abc.Loader):
    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def __getattr__(self, attr):  # get_resource_reader, is_package, ...
        return getattr(self._loader, attr)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _run(self._name, module, _callbacks.pop(self._name, []))
