"""Lightning: one callback, or none under STEPSCOPE=1.

    Trainer(callbacks=[stepscope.integrations.lightning.StepscopeCallback()])

Works with both ``lightning.pytorch`` and ``pytorch_lightning``. The phases
come from the PyTorch integration's hooks (Lightning runs forward and
backward inside ``optimizer.step``'s closure; they nest in Optimizer and are
counted once). The callback adds what only Lightning knows:

* the sanity-check validation batches are not counted as steps;
* Lightning's own actions (``run_training_batch``, ``[Strategy]...backward``,
  every hook) are kept as ``framework`` annotations, through a forwarding
  profiler put in place of ``trainer.profiler`` that still drives the user's
  own ``profiler="simple"|"advanced"|"pytorch"`` and its report;
* the session is started if none runs (and stopped again at teardown).
"""

from __future__ import annotations

import sys
from typing import Optional

from stepscope.core import _native, safety
from stepscope.integrations._base import Instrumentor, version_supported

__all__ = ["StepscopeCallback", "instrument", "uninstrument", "is_instrumented", "instrumentor"]

FRAMEWORK = _native.CATEGORIES.index("framework")
_NAMESPACES = ("lightning.pytorch", "pytorch_lightning")
_classes: dict = {}


def _namespace(preferred: Optional[str] = None):
    """The Lightning package in use: the one already imported, lightning.pytorch first."""
    import importlib

    names = [preferred] if preferred else [n for n in _NAMESPACES if n in sys.modules] or list(_NAMESPACES)
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("stepscope.integrations.lightning needs Lightning: pip install lightning")


def _tracker():
    from stepscope.integrations import torch as st_torch

    return st_torch.step_tracker()


def _forwarding_profiler_class(pl):
    base = pl.profilers.Profiler

    class ForwardingProfiler(base):
        """Records Lightning's actions as annotations and forwards them to the user's profiler."""

        def __init__(self, inner):
            super().__init__()
            self._inner = inner
            self._open: dict = {}
            # Lightning wraps ~30 actions per batch (every hook of every callback) in
            # profile(); with nothing to forward to, a C span replaces the generator-based
            # context manager, so profiling them costs less than Lightning's default.
            self._passthrough = isinstance(inner, pl.profilers.PassThroughProfiler)

        def profile(self, action_name: str):
            if self._passthrough:
                return _native.annotate(action_name, FRAMEWORK)
            return super().profile(action_name)

        def start(self, action_name: str) -> None:
            self._open[action_name] = _native.now()
            self._inner.start(action_name)

        def stop(self, action_name: str) -> None:
            self._inner.stop(action_name)
            t0 = self._open.pop(action_name, None)
            if t0 is not None:
                _native.span(FRAMEWORK, _native.intern(action_name), t0)

        def summary(self) -> str:
            return self._inner.summary()

        def describe(self) -> None:
            self._inner.describe()

        def setup(self, *args, **kwargs) -> None:
            self._inner.setup(*args, **kwargs)

        def teardown(self, *args, **kwargs) -> None:
            self._inner.teardown(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.__dict__["_inner"], name)

    return ForwardingProfiler


def _callback_class(pl):
    if pl.__name__ in _classes:
        return _classes[pl.__name__]
    forwarding = _forwarding_profiler_class(pl)

    class _StepscopeCallback(pl.Callback):
        def __init__(self, **start_kwargs):
            super().__init__()
            self._start_kwargs = start_kwargs
            self._started = None
            self._inner_profiler = None

        @safety.guarded("the Lightning callback failed")
        def setup(self, trainer, pl_module, stage):
            import stepscope

            _tracker()  # instrument first: it knows the rank of an initialised process group
            if stepscope.current() is None:
                self._started = stepscope.start(**self._start_kwargs)
            if not isinstance(trainer.profiler, forwarding):
                self._inner_profiler = trainer.profiler
                trainer.profiler = forwarding(trainer.profiler)

        @safety.guarded("the Lightning callback failed")
        def on_sanity_check_start(self, trainer, pl_module):
            tracker = _tracker()
            if tracker is not None:
                tracker.suspend()

        @safety.guarded("the Lightning callback failed")
        def on_sanity_check_end(self, trainer, pl_module):
            tracker = _tracker()
            if tracker is not None:
                tracker.resume()

        @safety.guarded("the Lightning callback failed")
        def teardown(self, trainer, pl_module, stage):
            if self._inner_profiler is not None and isinstance(trainer.profiler, forwarding):
                trainer.profiler = self._inner_profiler
                self._inner_profiler = None
            if self._started is not None:
                self._started.stop()
                self._started = None

    _StepscopeCallback.__name__ = _StepscopeCallback.__qualname__ = "StepscopeCallback"
    _StepscopeCallback.__module__ = __name__
    _classes[pl.__name__] = _StepscopeCallback
    return _StepscopeCallback


def StepscopeCallback(namespace: Optional[str] = None, **start_kwargs):
    """A callback for ``Trainer(callbacks=[...])``; keywords as for ``stepscope.start``."""
    return _callback_class(_namespace(namespace))(**start_kwargs)


def _has_ours(trainer) -> bool:
    return any(type(cb).__name__ == "StepscopeCallback" and type(cb).__module__ == __name__
               for cb in getattr(trainer, "callbacks", []))


class LightningInstrumentor(Instrumentor):
    """Zero-edit mode: every Trainer created gets the callback (unless it has one)."""

    name = "lightning"
    distribution = ""  # two distributions (lightning, pytorch_lightning); 2.x checked below
    supported = ""

    def _instrument(self, namespace: Optional[str] = None) -> None:
        for pl in _loaded_namespaces(namespace):
            version = str(getattr(pl, "__version__", "0"))
            if not version_supported(version, ">=2.0"):
                safety.warn_once(f"unsupported:{pl.__name__}", f"stepscope: {pl.__name__} {version} is outside "
                                 "the versions this integration knows (>=2.0); it is not instrumented")
                continue
            self.patch(pl.Trainer, "__init__", lambda original, pl=pl: _adding_callback(original, pl))

    def on_import(self, module) -> None:
        # `import lightning` imports lightning.pytorch lazily: patch what is importable now.
        name = "lightning.pytorch" if module.__name__ == "lightning" else module.__name__
        if self._on:  # the other namespace came later: patch it too
            self._patch_namespace(name)
        else:
            self.ensure(namespace=name)

    def _patch_namespace(self, name: str) -> None:
        try:
            pl = _namespace(name)
        except ImportError:
            return
        if getattr(pl.Trainer.__init__, "__stepscope_lightning__", False):
            return
        self.patch(pl.Trainer, "__init__", lambda original: _adding_callback(original, pl))


def _loaded_namespaces(namespace: Optional[str]):
    if namespace:
        return [_namespace(namespace)]
    loaded = [sys.modules[n] for n in _NAMESPACES if n in sys.modules]
    return loaded or [_namespace()]


def _adding_callback(original, pl):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            if not _has_ours(self):
                self.callbacks.append(_callback_class(pl)())
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("adding the Lightning callback failed", exc)

    __init__.__stepscope_lightning__ = True
    return __init__


instrumentor = LightningInstrumentor()


def instrument(namespace: Optional[str] = None) -> bool:
    """Adds the callback to every Trainer created from now on (zero-edit mode)."""
    return instrumentor.instrument(namespace=namespace, stacklevel=3)


def uninstrument() -> None:
    instrumentor.uninstrument()


def is_instrumented() -> bool:
    return instrumentor.is_instrumented()
