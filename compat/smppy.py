"""A drop-in for SageMaker Profiler's ``smppy`` module (SPEC §1).

A script written for SageMaker Profiler runs with its import changed to
``from stepscope.compat import smppy`` (or unchanged under ``STEPSCOPE=1``,
where ``import smppy`` resolves here when no such package is installed):

    sm_prof = smppy.SMProfiler.instance()
    config = smppy.Config()
    config.profiler = {"EnableCuda": "1"}
    sm_prof.configure(config)
    sm_prof.start_profiling()
    for i, batch in enumerate(loader):
        with smppy.annotate("step_" + str(i)):       # a step
            with smppy.annotate("Forward"):           # a phase
                ...
    sm_prof.stop_profiling()

What the names mean (docs/migrating.md):

* ``step_N`` annotations mark steps, as ``stepscope.step()`` does: a step runs from
  its annotation's start to the next one's, the last ends where its annotation ended.
* ``Forward``, ``Loss``, ``Backward``, ``Optimizer`` and ``GetNext`` (any case) are
  phases; where a framework integration already records that phase (PyTorch records
  all five, tf.data its GetNext) the annotation stays a plain annotation, so each
  phase is counted once.
* ``start_profiling()`` with no session running starts one and instruments the
  frameworks as zero-edit mode does; ``stop_profiling()`` then ends it. Under
  ``STEPSCOPE=1`` the session lives as long as the process, and the
  ``start_profiling()``/``stop_profiling()`` windows bound the detailed recording
  (GPU activity tracing, as ``STEPSCOPE_STEPS`` does) while steps, phases and system
  metrics stay on for the whole job.

SageMaker Profiler's options that have a stepscope meaning are mapped
(``EnableCuda`` -> GPU tracing); the rest are accepted and ignored.
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Optional

import stepscope
from stepscope.core import recording, safety
from stepscope.core import session as _sessions
from stepscope.core.recording import INTERNAL, PHASE
from stepscope.core.vocabulary import PHASES

__all__ = ["Config", "SMProfiler", "annotate", "annotation_begin", "annotation_end"]

STEP_NAME = re.compile(r"^step[_:\-]?\d+$", re.IGNORECASE)  # step_12, Step-3, step12
PHASE_OF = {p.lower(): p for p in PHASES}  # forward -> Forward
PHASE_CATEGORY = PHASE
# an internal span per start/stop_profiling window (internal: no step holds it, so it stays
# out of the tables that expect spans inside steps, such as the smdebug frames)
WINDOW_CATEGORY = INTERNAL
WINDOW_SPAN = "smppy.profiling"
# integration module -> the phases it records itself when instrumented
RECORDED_BY = {"stepscope.integrations.torch": set(PHASES), "stepscope.integrations.tfdata": {"GetNext"}}
_open = threading.local()  # per-thread stack of (name, handle) for annotation_end(name)


# --- steps from step_N annotations ---------------------------------------------------------
class _Steps:
    """The step a ``step_N`` annotation opened stays open until the next one begins
    (steps are contiguous); when none follows, it ends where its annotation ended."""

    def __init__(self):
        self.last_exit = 0  # tick: where the open annotated step's annotation ended; 0: none open
        self.hooked = False

    @safety.guarded("smppy: marking a step failed")
    def begin(self) -> None:
        if stepscope.current() is None:
            return
        if not self.hooked:  # the session's stop ends the last step where its annotation ended
            _sessions.on_stop(self.close)
            self.hooked = True
        stepscope.step("train")  # the program marks its steps: integrations record phases only
        self.last_exit = 0

    @safety.guarded("smppy: marking a step failed")
    def ended(self) -> None:
        self.last_exit = recording.now()

    @safety.guarded("smppy: ending the last step failed")
    def close(self) -> None:
        if self.last_exit:
            recording.end_step(self.last_exit)
            self.last_exit = 0


_steps = _Steps()


def _recorded_elsewhere(phase: str) -> bool:
    """True when an instrumented integration records this phase itself."""
    for module, phases in RECORDED_BY.items():
        integration = sys.modules.get(module)
        inst = getattr(integration, "instrumentor", None)
        if phase in phases and inst is not None and inst.is_instrumented():
            return True
    return False


def _span(name: str):
    """The native span for an annotation of this name (not yet entered)."""
    phase = PHASE_OF.get(name.lower()) if isinstance(name, str) else None
    if phase is not None and not _recorded_elsewhere(phase):
        return recording.annotate(phase, PHASE_CATEGORY)
    return recording.annotate(name)


class _StepAnnotation:
    """``annotate("step_N")``: a step begins, and the annotation is recorded as written."""

    def __init__(self, name: str):
        self.name = name
        self._span = None

    def __enter__(self):
        _steps.begin()
        self._span = recording.annotate(self.name)
        self._span.__enter__()
        return self

    def __exit__(self, *exc):
        if self._span is not None:
            self._span.__exit__(*exc)
            self._span = None
        _steps.ended()
        return False

    def __call__(self, func):  # @smppy.annotate("step_0") as a decorator
        import functools

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with _StepAnnotation(self.name):
                return func(*args, **kwargs)

        return wrapper


def annotate(name, *args):
    """``with smppy.annotate("name"):`` (or a decorator): a span; step and phase names are
    steps and phases (see the module's docstring)."""
    if isinstance(name, str):
        if STEP_NAME.match(name):
            return _StepAnnotation(name)
        if name.lower() in PHASE_OF:
            return _span(name)
    return recording.annotate(name, *args)


def annotation_begin(name: str):
    """Opens an annotation; close it with ``annotation_end(name)`` (or the returned handle)."""
    if isinstance(name, str) and STEP_NAME.match(name):
        handle = _StepAnnotation(name)
        handle.__enter__()
    elif isinstance(name, str) and name.lower() in PHASE_OF:
        handle = _span(name)
        handle.__enter__()
    else:
        handle = recording.annotation_begin(name)
    stack = getattr(_open, "stack", None)
    if stack is None:
        stack = _open.stack = []
    stack.append((name, handle))
    return handle


def _close(handle) -> None:
    if isinstance(handle, _StepAnnotation):
        handle.__exit__(None, None, None)
    else:
        recording.annotation_end(handle)


def annotation_end(name_or_handle) -> None:
    """Closes the innermost open annotation with this name (or this handle)."""
    stack = getattr(_open, "stack", None) or []
    for i in range(len(stack) - 1, -1, -1):
        name, handle = stack[i]
        if name_or_handle is handle or name == name_or_handle:
            del stack[i]
            _close(handle)
            return
    if isinstance(name_or_handle, (recording.Span, _StepAnnotation)):  # begun on another thread
        _close(name_or_handle)


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
        self._own = None  # the session start_profiling() started (none under STEPSCOPE=1)
        self._window = 0  # tick: start of the open profiling window; 0: none
        # A zero-edit session records from the start: until start_profiling(), only what
        # stays on for the whole job (steps, phases, system metrics) is wanted.
        if stepscope.current() is not None:
            self._pause_detail()

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
        """Starts a session (instrumenting the frameworks) or, in a running one, opens a
        window of detailed recording."""
        if stepscope.current() is None:
            self._own = stepscope.start(**self._options())
            if self._own is not None:
                _instrument_frameworks()
        else:
            self._resume_detail()
        self._window = recording.now()

    def stop_profiling(self) -> None:
        """Ends the session start_profiling() started; in a session it did not start
        (``STEPSCOPE=1``), closes the window of detailed recording and nothing else."""
        _steps.close()
        if self._window and stepscope.current() is not None:
            recording.span(WINDOW_CATEGORY, recording.intern(WINDOW_SPAN), self._window, recording.now())
        self._window = 0
        if self._own is not None:
            self._own.stop()
            self._own = None
        else:
            self._pause_detail()

    @staticmethod
    @safety.guarded("smppy: pausing GPU activity tracing failed")
    def _pause_detail() -> None:
        from stepscope.core import gpu

        gpu.pause_activity_tracing()

    @staticmethod
    @safety.guarded("smppy: resuming GPU activity tracing failed")
    def _resume_detail() -> None:
        from stepscope.core import gpu

        gpu.resume_activity_tracing(reason="outside smppy's start_profiling()/stop_profiling() windows")

    # SageMaker Profiler also exposed the annotation calls on the instance.
    annotate = staticmethod(annotate)
    annotation_begin = staticmethod(annotation_begin)
    annotation_end = staticmethod(annotation_end)


@safety.guarded("smppy: instrumenting the frameworks failed")
def _instrument_frameworks() -> None:
    """What zero-edit start does: each registered instrumentor turns on now if its framework
    is imported, else right after the script imports it."""
    from stepscope.core import plugins

    plugins.instrument_when_imported()


def install_import_alias() -> None:
    """Makes ``import smppy`` / ``import smprof`` resolve here when neither is installed."""
    import importlib.abc
    import importlib.util

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
