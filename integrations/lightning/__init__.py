"""Lightning: one callback, or none under STEPSCOPE=1.

    Trainer(callbacks=[stepscope.integrations.lightning.StepscopeCallback()])

Works with both ``lightning.pytorch`` and ``pytorch_lightning``. The phases
come from the PyTorch integration's hooks (Lightning runs forward and
backward inside ``optimizer.step``'s closure; they nest in Optimizer and are
counted once). The callback adds what only Lightning knows:

* the sanity-check validation batches are not counted as steps;
* Lightning's own actions (``run_training_batch``, ``[Strategy]...backward``,
  every hook) are kept as ``framework`` annotations, by tapping the trainer's
  profiler for the fit (``_ProfilerTap``); the user's own
  ``profiler="simple"|"advanced"|"pytorch"`` sees exactly its usual calls;
* the session is started if none runs (and stopped again at teardown).
"""

from __future__ import annotations

import sys
from typing import Optional

from stepscope.core import safety
from stepscope.core.recording import FRAMEWORK, annotate, intern, now, span
from stepscope.integrations._base import Instrumentor, version_supported
from stepscope.integrations._late_class import late_class

__all__ = ["StepscopeCallback", "instrument", "uninstrument", "is_instrumented", "instrumentor"]

_NAMESPACES = ("lightning.pytorch", "pytorch_lightning")


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


class _ProfilerTap:
    """Records Lightning's actions as annotations by tapping the trainer's own
    profiler from the trainer's creation: instance attributes (this tap's bound
    methods) shadow its ``start``/``stop`` (and, for the do-nothing
    PassThroughProfiler, ``profile``). The user's profiler stays the trainer's
    profiler and sees exactly the calls it sees without stepscope (the actions
    of stepscope's own callback hooks are not passed on). Nothing else of it
    changes: no wrapper object whose inherited ``__del__`` would tear it down.

    A trainer is pickled to the processes of ``strategy="ddp_spawn"``: the tap
    pickles as its profiler and kind, and the copy is tapped from its first
    action as well."""

    def __init__(self, profiler, passthrough: bool):
        self.profiler = profiler
        self.passthrough = passthrough
        self.open: dict = {}
        cls = type(profiler)
        self._start, self._stop = cls.start, cls.stop
        profiler.__dict__["start"] = self.start
        profiler.__dict__["stop"] = self.stop
        if passthrough:
            profiler.__dict__["profile"] = self.profile

    def __reduce__(self):
        return _ProfilerTap, (self.profiler, self.passthrough)

    def start(self, action_name: str) -> None:
        self.open[action_name] = now()
        if _OURS not in action_name:
            self._start(self.profiler, action_name)

    def stop(self, action_name: str) -> None:
        t0 = self.open.pop(action_name, None)
        if _OURS not in action_name or t0 is None:  # (ours begun before the tap: balance it)
            self._stop(self.profiler, action_name)
        if t0 is not None:
            span(FRAMEWORK, intern(action_name), t0)

    @staticmethod
    def profile(action_name: str):
        # ~30 actions per batch: a C span instead of the generator-based context manager
        return annotate(action_name, FRAMEWORK)


_OURS = "StepscopeCallback"


@late_class(__name__, "StepscopeCallback")  # one class per namespace (lightning.pytorch, pytorch_lightning)
def _callback_class(pl):
    class StepscopeCallback(pl.Callback):
        def __init__(self, **start_kwargs):
            super().__init__()
            self._start_kwargs = start_kwargs
            self._started = None
            self._tap = None

        def __reduce__(self):
            # Pickled with its trainer (strategy="ddp_spawn") or deep-copied: a fresh callback
            # (no session, no tap), rebuilt by name, since this class is made at run time.
            return _rebuilt_callback, (pl.__name__, dict(self._start_kwargs))

        @safety.guarded("the Lightning callback failed")
        def setup(self, trainer, pl_module, stage):
            from stepscope.core import session

            _tracker()  # instrument first: it knows the rank of an initialised process group
            if session.current() is None:
                self._started = session.start(**self._start_kwargs)
            self._tap_profiler(pl, trainer.profiler)  # a trainer made before the callback

        def _tap_profiler(self, pl, profiler) -> None:
            if self._tap is None and "start" not in getattr(profiler, "__dict__", {"start": 1}):
                self._tap = _ProfilerTap(profiler, isinstance(profiler, pl.profilers.PassThroughProfiler))

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

        # Epoch edges (SPEC §3): the last train or validation step of a pass ends where its
        # batch ended; validation start-up and an epoch's end are between loops, named by
        # the summary, not a last step's Other (StepOutlier saw every epoch's last step).
        @safety.guarded("the Lightning callback failed")
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._batch_end = now()

        @safety.guarded("the Lightning callback failed")
        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            self._batch_end = now()

        @safety.guarded("the Lightning callback failed")
        def on_validation_start(self, trainer, pl_module):
            self._loop_ended(trainer)  # the training before it, mid-epoch or at its end

        @safety.guarded("the Lightning callback failed")
        def on_validation_epoch_start(self, trainer, pl_module):
            if not trainer.sanity_checking:
                from stepscope.integrations import torch as st_torch

                st_torch.pass_starts_at_next_fetch()  # the loader was iterated before the hooks

        @safety.guarded("the Lightning callback failed")
        def on_validation_end(self, trainer, pl_module):
            self._loop_ended(trainer)

        @safety.guarded("the Lightning callback failed")
        def on_train_epoch_end(self, trainer, pl_module):
            self._loop_ended(trainer)  # an epoch without validation at its end

        def _loop_ended(self, trainer) -> None:
            at, self._batch_end = getattr(self, "_batch_end", 0), 0
            if not trainer.sanity_checking:
                from stepscope.integrations import torch as st_torch

                st_torch.loop_ended(at)

        @safety.guarded("the Lightning callback failed")
        def on_predict_start(self, trainer, pl_module):
            from stepscope.integrations import torch as st_torch

            self._predicting = st_torch.forced_mode("predict")  # looks like eval to the hooks
            self._predicting.__enter__()

        @safety.guarded("the Lightning callback failed")
        def on_predict_end(self, trainer, pl_module):
            predicting, self._predicting = getattr(self, "_predicting", None), None
            if predicting is not None:
                predicting.__exit__(None, None, None)

        @safety.guarded("the Lightning callback failed")
        def teardown(self, trainer, pl_module, stage):
            if self._started is not None:
                self._started.stop()
                self._started = None

    return StepscopeCallback


def StepscopeCallback(namespace: Optional[str] = None, **start_kwargs):
    """A callback for ``Trainer(callbacks=[...])``; keywords as for ``stepscope.start``."""
    pl = _namespace(namespace)
    if not instrumentor.is_instrumented():
        _tapping.ensure(namespace=pl.__name__)
    return _callback_class(pl)(**start_kwargs)


def _rebuilt_callback(namespace: str, start_kwargs: dict):
    return StepscopeCallback(namespace, **start_kwargs)


def _ours(trainer):
    for cb in getattr(trainer, "callbacks", []):
        if type(cb).__name__ == "StepscopeCallback" and type(cb).__module__ == __name__:
            return cb
    return None


class LightningInstrumentor(Instrumentor):
    """Wraps ``Trainer.__init__``: a trainer with our callback has its profiler
    tapped from its first action (our own hooks never reach the user's profiler);
    in zero-edit mode (``adds``) every trainer gets the callback."""

    name = "lightning"
    distribution = ""  # two distributions (lightning, pytorch_lightning); 2.x checked below
    supported = ""

    def __init__(self, adds: bool):
        super().__init__()
        self.adds = adds

    def _instrument(self, namespace: Optional[str] = None) -> None:
        for pl in _loaded_namespaces(namespace):
            version = str(getattr(pl, "__version__", "0"))
            if not version_supported(version, ">=2.0"):
                safety.warn_once(f"unsupported:{pl.__name__}", f"stepscope: {pl.__name__} {version} is outside "
                                 "the versions this integration knows (>=2.0); it is not instrumented")
                continue
            self._patch_trainer(pl)

    def _patch_trainer(self, pl) -> None:
        self.patch(pl.Trainer, "__init__", lambda original: _trainer_init(original, pl, self.adds))

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
        if getattr(pl.Trainer.__init__, "__stepscope_lightning__", None) == self.adds:
            return
        self._patch_trainer(pl)


def _loaded_namespaces(namespace: Optional[str]):
    if namespace:
        return [_namespace(namespace)]
    loaded = [sys.modules[n] for n in _NAMESPACES if n in sys.modules]
    return loaded or [_namespace()]


def _trainer_init(original, pl, adds: bool):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            ours = _ours(self)
            if ours is None and adds:
                ours = _callback_class(pl)()
                self.callbacks.append(ours)
            if ours is not None:
                ours._tap_profiler(pl, self.profiler)
        except Exception as exc:  # noqa: BLE001
            safety.report_failure("adding the Lightning callback failed", exc)

    __init__.__stepscope_lightning__ = adds
    return __init__


instrumentor = LightningInstrumentor(adds=True)  # zero-edit mode
_tapping = LightningInstrumentor(adds=False)  # turned on by the first StepscopeCallback()


def instrument(namespace: Optional[str] = None) -> bool:
    """Adds the callback to every Trainer created from now on (zero-edit mode)."""
    return instrumentor.instrument(namespace=namespace, stacklevel=3)


def uninstrument() -> None:
    instrumentor.uninstrument()


def is_instrumented() -> bool:
    return instrumentor.is_instrumented()
