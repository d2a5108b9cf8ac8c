"""A drop-in for SageMaker Profiler's ``smppy`` module (SPEC §1).

A script written for SageMaker Profiler runs with its import changed to
``from stepscope.compat import smppy`` (or unchanged under ``STEPSCOPE=1``,
where ``import smppy`` resolves here when no such package is installed):

    sm_prof = smppy.SMProfiler.instance()
    config = smppy.Config()
    config.profiler = {"EnableCuda": "1"}
    sm_prof.configure(config)
    sm_prof.start_profiling()
    with smppy.annotate("forward"):
        ...
    smppy.annotation_begin("backward"); ...; smppy.annotation_end("backward")
    sm_prof.stop_profiling()

SageMaker Profiler's options that have a stepscope meaning are mapped
(``EnableCuda`` -> GPU tracing); the rest are accepted and ignored.
"""

from __future__ import annotations

import threading
from typing import Optional

import stepscope
from stepscope.core import _native

__all__ = ["Config", "SMProfiler", "annotate", "annotation_begin", "annotation_end"]

annotate = _native.annotate
_open = threading.local()  # per-thread stack of (name, handle) for annotation_end(name)


def annotation_begin(name: str):
    """Opens an annotation; close it with ``annotation_end(name)`` (or the returned handle)."""
    handle = _native.annotation_begin(name)
    stack = getattr(_open, "stack", None)
    if stack is None:
        stack = _open.stack = []
    stack.append((name, handle))
    return handle


def annotation_end(name_or_handle) -> None:
    """Closes the innermost open annotation with this name (or this handle)."""
    stack = getattr(_open, "stack", None) or []
    for i in range(len(stack) - 1, -1, -1):
        name, handle = stack[i]
        if name_or_handle is handle or name == name_or_handle:
            del stack[i]
            _native.annotation_end(handle)
            return
    if isinstance(name_or_handle, _native.Span):  # begun on another thread
        _native.annotation_end(name_or_handle)


class Config:
    """SageMaker Profiler's configuration object: ``config.profiler = {...}``."""

    def __init__(self, profiler: Optional[dict] = None):
        self.profiler = dict(profiler or {})


class SMProfiler:
    """The process-wide profiler handle, as in SageMaker Profiler."""

    _instance: Optional["SMProfiler"] = None
    _lock = threading.Lock()

    def __init__(self):
        self._config = Config()
        self._session = None

    @classmethod
    def instance(cls) -> "SMProfiler":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def configure(self, config: Config) -> None:
        self._config = config

    def _options(self) -> dict:
        opts = {}
        cuda = str(self._config.profiler.get("EnableCuda", "")).strip()
        if cuda in ("1", "true", "True"):
            opts["gpu"] = "trace"
        elif cuda in ("0", "false", "False"):
            opts["gpu"] = "off"
        return opts

    def start_profiling(self) -> None:
        self._session = stepscope.current() or stepscope.start(**self._options())

    def stop_profiling(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None

    # SageMaker Profiler also exposed the annotation calls on the instance.
    annotate = staticmethod(annotate)
    annotation_begin = staticmethod(annotation_begin)
    annotation_end = staticmethod(annotation_end)


def install_import_alias() -> None:
    """Makes ``import smppy`` / ``import smprof`` resolve here when neither is installed."""
    import importlib.abc
    import importlib.util
    import sys

    missing = []
    for name in ("smppy", "smprof"):
        if name in sys.modules:
            continue
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    if not missing:
        return
    target = sys.modules[__name__]

    class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path=None, target_=None):
            if fullname in missing:
                return importlib.util.spec_from_loader(fullname, self)
            return None

        def create_module(self, spec):
            return target

        def exec_module(self, module):
            pass

    sys.meta_path.append(_Alias())
