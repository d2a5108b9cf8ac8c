"""Sampled TensorFlow profiler windows: Forward/Loss/Backward/Optimizer of compiled steps.

A compiled ``train_step`` is one opaque call from Python. For a few steps per
epoch a ``tf.profiler`` session records its ops (costing +13-48% on those
steps only); the XSpace it produces is parsed (``_xspace``) and each sampled
step gets phase spans written into the run at their real times.

Sampling policy (``plan``):

* without ``STEPSCOPE_STEPS``: one window per epoch, in the middle of the
  epoch (away from the first steps, which trace and compile, and from a short
  last batch), of ``clamp(steps_per_epoch // 100, 1, 5)`` steps. A window costs
  +13-50% on its own steps and ~4 ms to export and parse (an XLA program's HLO
  is read once per process, ~10 ms more the first time): <= 2% of any epoch of
  >= 1 s (e.g. 200 steps of 5 ms, or 1000 of 1 ms); shorter epochs still get
  one sampled step each, at a higher relative cost.
* with ``STEPSCOPE_STEPS=a-b``: exactly train steps a..b (numbered from 0 over
  the whole session, as in the run), one window.

Only sampled steps carry Forward/Loss/Backward/Optimizer. Read phase shares
of a compiled Keras run over those steps (``steps[steps.Forward > 0]``): they
estimate the split of every step of the same epoch; shares taken over all
steps are diluted by the unsampled ones.

Yielding: when a TensorFlow profiler runs already (a ``TensorBoard(
profile_batch=...)`` callback, ``tf.profiler.experimental.start``) no window
opens; when one starts while a window is open, the window is abandoned first.
Either way one line on stderr, and training goes on.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import tempfile
import threading
import weakref
from typing import List, Optional, Tuple

from stepscope.core import safety
from stepscope.core.quiet import native_logs_dropped
from stepscope.core.recording import FRAMEWORK, OP, PHASE, clock_info, intern, now, span
from stepscope.core.vocabulary import OTHER, pack_op_arg
from stepscope.integrations.keras import _xspace

# What TensorFlow's C++ profiler logs on its own when a window opens and closes:
# the job's stderr is the user's, so these lines are dropped (nothing else is).
TF_PROFILER_LOGS = re.compile(
    rb"^(?:[IWE]\d{4} [^\]]*\] .*(?:[Pp]rofiler session|expects an i value|Collecting XSpace|cuInit)"
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called)")

WINDOW_NAME = intern("stepscope.profiler_window")
PHASE_IDS = {name: intern(name) for name in ("GetNext", *_xspace.ORDER)}
YIELD_MESSAGE = ("stepscope: TensorFlow's profiler is in use (TensorBoard profile_batch?); stepscope yields and "
                 "samples no phases while it runs, the program continues unaffected")


def plan(steps_per_epoch: Optional[int]) -> Tuple[int, int]:
    """(first batch of the epoch's window, its length) for an epoch of that many steps."""
    if not steps_per_epoch:
        return 2, 2
    length = max(1, min(5, steps_per_epoch // 100))
    return max(0, (steps_per_epoch - length) // 2), length


class Window:
    """One open profiler session over consecutive train steps."""

    def __init__(self, profiler_mod, scopes: _xspace.Scopes):
        self.profiler_mod = profiler_mod
        self.scopes = scopes
        self.logdir = tempfile.mkdtemp(prefix="stepscope-tfprof-")
        from tensorflow.python.profiler.internal import _pywrap_profiler, _pywrap_traceme

        self.session = _pywrap_profiler.ProfilerSession()
        # No options: TF 2.21 ignores them all with a warning each ("expects an i
        # value"); its defaults are the levels wanted (host 2, python 0, device 1).
        with native_logs_dropped(TF_PROFILER_LOGS):
            self.session.start(self.logdir, {})
        self.opened = now()
        t_a = now()
        _pywrap_traceme.TraceMe(_xspace.SYNC_NAME).Stop()
        t_b = now()
        self.sync_ticks = (t_a + t_b) / 2
        self.step_begins: List[int] = []

    def abandon(self) -> None:
        try:
            with native_logs_dropped(TF_PROFILER_LOGS):
                self.session.stop()
        finally:
            shutil.rmtree(self.logdir, ignore_errors=True)

    def close(self, end: int) -> None:
        """Stops the session and writes the sampled steps' phases (each step ends
        where the next begins, the last at `end`)."""
        try:
            with native_logs_dropped(TF_PROFILER_LOGS):
                self.session.export_to_tb()
            data = None
            for root, _, files in os.walk(self.logdir):
                for f in files:
                    if f.endswith(".xplane.pb"):
                        with open(os.path.join(root, f), "rb") as fh:
                            data = fh.read()
        finally:
            shutil.rmtree(self.logdir, ignore_errors=True)
        if data is None or not self.step_begins:
            return
        trace = _xspace.parse(data, self.scopes)
        if not trace.sync:
            return
        x0, x1 = trace.sync[0]
        x_mid = (x0 + x1) / 2
        ticks_per_ns = clock_info()["ticks_per_ns"]

        def to_x(tick):
            return x_mid + (tick - self.sync_ticks) / ticks_per_ns

        def to_tick(x):
            return int(self.sync_ticks + (x - x_mid) * ticks_per_ns)

        bounds = self.step_begins + [end]
        for b0, b1 in zip(bounds, bounds[1:]):
            for phase, s0, s1 in _xspace.split_step(trace, to_x(b0), to_x(b1)):
                t0, t1 = max(to_tick(s0), b0), min(to_tick(s1), b1)
                if t1 > t0:
                    span(PHASE, PHASE_IDS[phase], t0, t1)
        write_ops(trace.ops, to_tick, bounds[0], end)
        write_pipeline(trace.data, to_tick, bounds[0], end)
        span(FRAMEWORK, WINDOW_NAME, self.opened)  # open to parsed: what the window cost


def write_ops(ops: List[_xspace.Op], to_tick, first: int, end: int) -> None:
    """The sampled steps' TensorFlow ops as ``op`` spans (docs/format.md), each with
    the phase its name scope says (its time may fall in another: phases of a
    compiled step are laid out from op shares)."""
    _write_lines(((op.line, OP, op.name, to_tick(op.start_ns), to_tick(op.end_ns), op.phase or OTHER)
                  for op in ops), first, end)


def write_pipeline(data, to_tick, first: int, end: int) -> None:
    """tf.data's per-iterator spans of the sampled steps, as framework spans named by
    the iterator's path (``Iterator::Root::Prefetch::ParallelMapV2``): nested by
    stage on each thread, so a stage's self time is its own work or wait."""
    _write_lines(((line, FRAMEWORK, name, to_tick(t0), to_tick(t1), None) for name, t0, t1, line in data),
                 first, end)


def _write_lines(records, first: int, end: int) -> None:
    """TensorFlow runs ops (and tf.data stages) on pools of threads: each XSpace line
    is written from a thread of its own, so spans nest (and self times count) per
    thread, as they ran."""
    by_line: dict = {}
    for line, cat, name, t0, t1, phase in records:
        if first <= t0 < end:
            by_line.setdefault(line, []).append((cat, name, t0, max(t1, t0), phase))
    for spans in by_line.values():
        helper = threading.Thread(target=_write_line, args=(spans,), name="stepscope-ops", daemon=True)
        helper.start()
        helper.join()


_op_index = itertools.count(1)  # per process, as torch's (an op counter's argument would name it)
_names: dict = {}


def _write_line(spans) -> None:
    for cat, name, t0, t1, phase in spans:
        nid = _names.get(name)
        if nid is None:
            nid = _names[name] = intern(name)
        if cat == OP:
            span(OP, nid, t0, t1, pack_op_arg(-1, next(_op_index), phase))
        else:
            span(cat, nid, t0, t1)


def optimizer_names(optimizer) -> tuple:
    """The name scopes an optimizer's update ops run under: a wrapper's (mixed_float16's
    ``loss_scale_optimizer``) and those of the optimizers it wraps, which build the updates."""
    names = []
    while optimizer is not None and len(names) < 4:
        names.append(getattr(optimizer, "name", None))
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return tuple(n for n in names if isinstance(n, str) and n)


class Sampler:
    """Opens and closes windows along a fit's train steps."""

    _live: "weakref.WeakSet[Sampler]" = weakref.WeakSet()

    @classmethod
    def live(cls):
        return list(cls._live)

    def __init__(self, model, steps_range: Optional[Tuple[int, int]]):
        Sampler._live.add(self)
        from stepscope.core import session

        session.on_stop(Sampler.discard_all)
        from tensorflow.python.profiler import profiler_v2

        self.profiler_mod = profiler_v2
        self.scopes = _xspace.Scopes(model.name, optimizer_names(getattr(model, "optimizer", None)))
        self.steps_range = steps_range
        self.window: Optional[Window] = None
        self.window_end_batch = -1

    def user_profiler_running(self) -> bool:
        return getattr(self.profiler_mod, "_profiler", None) is not None

    def window_ends_before(self, batch: int) -> bool:
        """At a train batch's begin: whether the open window's steps are all done."""
        return self.window is not None and batch > self.window_end_batch

    def after_step(self, step: int, batch: int, steps_per_epoch: Optional[int], t: int,
                   per_execution: int = 1) -> None:
        """Called right after the step mark at tick t: open a window if this step (or,
        with steps_per_execution, one of the steps this callback batch runs) is sampled."""
        if self.window is None and self.sampled(step, batch, steps_per_epoch, per_execution):
            if self.user_profiler_running():
                safety.warn_once("tf-profiler", YIELD_MESSAGE)
                return
            try:
                self.window = Window(self.profiler_mod, self.scopes)
            except Exception:  # noqa: BLE001 - e.g. a profiler server holds the session
                safety.warn_once("tf-profiler", YIELD_MESSAGE)
                return
            self.window_end_batch = batch + self.length(steps_per_epoch, step) - 1
        if self.window is not None:
            self.window.step_begins.append(t)

    def length(self, steps_per_epoch, step) -> int:
        if self.steps_range is not None:
            return self.steps_range[1] - step + 1
        return plan(steps_per_epoch)[1]

    def sampled(self, step: int, batch: int, steps_per_epoch: Optional[int], per_execution: int = 1) -> bool:
        if self.steps_range is not None:
            return self.steps_range[0] <= step + per_execution - 1 and step <= self.steps_range[1]
        first, _ = plan(steps_per_epoch)
        if steps_per_epoch:
            first = min(first, max(steps_per_epoch - 1, 0))
        return batch <= first < batch + per_execution

    def close(self, end: int) -> None:
        """Reads the window; its last sampled step ended at tick `end`."""
        window, self.window = self.window, None
        if window is not None:
            window.close(end)

    @classmethod
    def discard_all(cls) -> None:
        """At session stop: a window a failed fit left open is read now (its steps
        completed before the failure: their phases are the fit's only measured
        ones), its own log lines dropped (its teardown would print "Profiler session
        tear down." on the job's stderr at exit)."""
        for sampler in cls.live():
            window, sampler.window = sampler.window, None
            if window is not None:
                try:
                    window.close(now())
                except Exception:  # noqa: BLE001 - a profiler torn down first: the window is lost
                    window.abandon()

    def abandon(self) -> None:
        """A user's profiler is starting: give the profiler to it."""
        window, self.window = self.window, None
        if window is not None:
            safety.warn_once("tf-profiler", YIELD_MESSAGE)
            window.abandon()
