"""Operator windows: torch's own profiler, for a few sampled train steps.

For the steps of a window, torch's profiler (Kineto, CPU activity, input
shapes) records every operator; when the window closes its events are written
into the run as ``op`` spans on the thread that ran them, at their real times,
so they nest in their phase and step (docs/format.md, "Operator spans").

Policy (``Windows.plan_next``):

* without ``STEPSCOPE_STEPS``: train steps 5..7 (after warm-up), then a window
  of 2 steps every N steps, N widened so that the windows' measured cost
  (their steps' extra time plus opening, closing and writing) stays within 1%
  of the run's time since its first window, each window paying for itself
  over its interval, and at least ``MIN_GAP`` steps. A run shorter than a few
  hundred times one window's cost pays more than 1% for the first window.
  Only a loop on the main thread gets windows (Kineto starts only there).
* with ``STEPSCOPE_STEPS=a-b``: exactly train steps a..b, one window (two when a
  loop ends inside the range).
* ``STEPSCOPE_OPS=0``: no windows.

Hook: the step tracker calls ``at_step`` when a train step begins whose number
reaches ``StepTracker.ops_due`` (one comparison per step), and when an eval step
begins or a loop ends while a window is open (``ops_due == 0``). The window
closes where the step after its last one begins: the close costs ~5-15 ms and
falls in that step, inside the phase that began it, as the
``stepscope.op_window`` framework span. Opening (Kineto prepared and started:
~1-2 ms on the development VM) falls in the phase that began the first step, as
the ``stepscope.op_window_open`` span.

Torch allows one profiler: while the user's ``torch.profiler.profile`` is
started (even in its schedule's wait) or the autograd profiler runs, no window
opens; a user profiler starting during a window ends the window first (its ops
are dropped) with one stderr line, and the user's trace is complete.

With CUDA (seen on an H200, torch 2.11), Kineto owns CUPTI for the window:
stepscope's own activity tracing is paused, and the window's kernels, copies,
memsets and runtime calls are written back as GPU records with Kineto's
correlation ids, the runtime calls on the thread of the operator that
launched them, so ``analysis/tables/ops.py`` links kernels to operators.
"""

from __future__ import annotations

import re
import threading
import time
from typing import List, Optional, Tuple

from stepscope.core import config, gpu, recording, safety
from stepscope.core.quiet import native_logs_dropped
from stepscope.core.recording import FRAMEWORK, intern
from stepscope.core.vocabulary import TORCH_OP_WINDOW, TORCH_OP_WINDOW_OPEN
from stepscope.integrations._steps import StepTracker
from stepscope.integrations.torch._op_events import SYNC_OPS, OpWriter, Window

WINDOW_NAME = intern(TORCH_OP_WINDOW)
OPEN_NAME = intern(TORCH_OP_WINDOW_OPEN)
NEVER = 1 << 62

EARLY = (5, 3)  # first window: train steps 5..7
CALIBRATE = 2  # the step whose begin times the steps before the first window
LENGTH = 2  # steps of every later window
BUDGET = 0.01  # windows' share of the run's time
MIN_GAP = 50  # steps between windows, at least

# Kineto logs its session's start and stop on stderr, which is the job's.
KINETO_LOGS = re.compile(rb"^(?:USDT|STAGE|INFO|WARNING):\S* \S+ \d+:\d+ \S*ActivityProfiler\S*\.cpp")
YIELD_MESSAGE = ("stepscope: the program started torch's profiler; stepscope ends its operator window and "
                 "opens none while it runs, the program continues unaffected")


class Windows:
    """Plans, opens and closes operator windows along the train steps."""

    def __init__(self, torch, steps_range: Optional[Tuple[int, int]]):
        self.torch = torch
        self.steps_range = steps_range
        self.window: Optional[Window] = None
        self.user_profilers = 0  # torch.profiler.profile objects started by the program
        self.cost_ticks = 0  # every window's cost so far
        self.first_tick = 0  # the first window's open: the run time the budget is a share of
        self.last_close = None  # (step, tick) of the previous window's close
        self.windows = 0
        self.stats: List[dict] = []  # per window: steps, ops, cost (bench, tests)
        self.writer = OpWriter()  # the windows' ops into the run (_op_events.py)
        from torch._C import _autograd, _profiler

        self._autograd, self._profiler = _autograd, _profiler
        self._sync_tensor = torch.zeros(1, device="cpu")  # whatever the program's default device

    # --- hook --------------------------------------------------------------------------
    def install(self) -> None:
        StepTracker.ops_step = self.at_step
        StepTracker.ops_due = self.steps_range[0] if self.steps_range else CALIBRATE

    def uninstall(self) -> None:
        StepTracker.ops_due = NEVER
        StepTracker.ops_step = None
        if self.window is not None and self.window.thread == threading.get_ident():
            self.abandon()

    def at_step(self, tracker: StepTracker, step: int, at: int) -> None:
        """A train step ``step`` began at tick ``at`` (step -1: an eval step began or
        the loop ended). Never raises: a failure turns the windows off."""
        try:
            w = self.window
            if w is not None:
                if w.tracker is not tracker or w.thread != threading.get_ident():
                    return  # another thread's loop: the window is its opener's
                if step < 0 or step > w.last:
                    self.close(at, step)
                return
            if step < 0:
                return
            if self.steps_range is None and step < EARLY[0]:
                self.last_close = (step, recording.now())  # the step time before the first window
                StepTracker.ops_due = EARLY[0]
                return
            self.maybe_open(tracker, step)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        StepTracker.ops_due = NEVER
        w, self.window = self.window, None
        if w is not None:
            try:
                self._stop_kineto()
            except Exception:  # noqa: BLE001
                pass
            self._resume_gpu(w)
        safety.warn_once("torch-ops", f"stepscope: operator windows failed ({type(exc).__name__}: {exc}); "
                                      "they are turned off, the program continues unaffected")

    # --- policy ------------------------------------------------------------------------
    def user_profiler_running(self) -> bool:
        return self.user_profilers > 0 or self._autograd._profiler_enabled()

    def maybe_open(self, tracker: StepTracker, step: int) -> None:
        if self.steps_range is not None:
            lo, hi = self.steps_range
            if step > hi:
                StepTracker.ops_due = NEVER
                return
            first, last = step, hi
        else:
            first, last = step, step + (EARLY[1] if not self.windows else LENGTH) - 1
        if self.user_profiler_running() or threading.current_thread() is not threading.main_thread():
            # Kineto starts only on the thread that registered it (torch's import: the main
            # thread); elsewhere it says so on stderr, and crashed with two loops in two threads
            StepTracker.ops_due = NEVER if self.steps_range else step + MIN_GAP
            return
        now = recording.now()
        if self.steps_range is None and self.windows and not self.within_budget(step, now):
            return
        self.open(tracker, first, last, now)

    def within_budget(self, step: int, now: int) -> bool:
        """Whether another window keeps the windows' cost within BUDGET of the run's
        time so far (the last window's cost standing for the next one's)."""
        spent = now - self.first_tick
        last_cost = self.stats[-1]["cost_ticks"] if self.stats else 0
        if self.cost_ticks + last_cost <= BUDGET * spent:
            return True
        self.plan_next(step, now)
        return False

    def plan_next(self, step: int, now: int, per_step: float = 0.0) -> None:
        """The next window's first step: where the budget will allow it, at the step
        time seen since the last window, and at least MIN_GAP steps on."""
        if self.steps_range is not None:
            StepTracker.ops_due = NEVER
            return
        per_step = per_step or self.step_ticks(step, now)
        last_cost = self.stats[-1]["cost_ticks"] if self.stats else 0
        # the run so far must pay for every window and the next; and each window for itself,
        # so windows stay evenly spread once the first one's cost is paid for
        need = max((self.cost_ticks + last_cost) / BUDGET - (now - self.first_tick), last_cost / BUDGET)
        gap = MIN_GAP if per_step <= 0 else max(MIN_GAP, int(need / per_step) + 1)
        StepTracker.ops_due = step + gap

    def step_ticks(self, step: int, now: int) -> float:
        """Ticks per step since the last window closed (no window's cost in it)."""
        if self.last_close is None:
            return 0.0
        s0, t0 = self.last_close
        return (now - t0) / (step - s0) if step > s0 else 0.0

    # --- open / close ------------------------------------------------------------------
    def _config(self, cuda: bool):
        # state, input shapes, memory, stack, flops, modules, experimental config (, trace id: torch >= 2.4)
        p = self._profiler
        # With CUDA, Kineto's synchronization records stand in for the ones CUPTI gave
        # stepscope, and its metadata holds a copy's bytes (nbytes() reads it).
        for extra in ({"enable_cuda_sync_events": cuda, "expose_kineto_event_metadata": cuda},
                      {"enable_cuda_sync_events": cuda}, {}):
            try:
                experimental = p._ExperimentalConfig(**extra)
                break
            except TypeError:
                continue
        args = (p.ProfilerState.KINETO, True, False, False, False, False, experimental)
        try:
            return p.ProfilerConfig(*args, "")
        except TypeError:
            return p.ProfilerConfig(*args)

    def open(self, tracker: StepTracker, first: int, last: int, now: int) -> None:
        w = Window(tracker, first, last, now)
        activities = {self._profiler.ProfilerActivity.CPU}
        # Kineto with CUDA registers CUPTI's callbacks: stepscope's own tracing stands aside.
        if gpu.activity_tracing() and self._profiler.ProfilerActivity.CUDA in self._autograd._supported_activities():
            activities.add(self._profiler.ProfilerActivity.CUDA)
            gpu.pause_activity_tracing()
            w.cuda = True
        self.window = w
        StepTracker.ops_due = 0  # every step begin comes here until the window closes
        try:
            config = self._config(w.cuda)
            with native_logs_dropped(KINETO_LOGS):
                self._autograd._prepare_profiler(config, activities)
                self._autograd._enable_profiler(config, activities)
        except Exception:
            self.window = None
            self._resume_gpu(w)
            raise
        self._set_enabled(True)
        w.sync_open = self._sync()
        recording.span(FRAMEWORK, OPEN_NAME, now, recording.now())
        if not self.windows:
            self.first_tick = now
        self.windows += 1

    def _set_enabled(self, on: bool) -> None:
        # what torch.autograd.profiler's own start/stop do: record_function checks it
        from torch.autograd import profiler

        setter = getattr(profiler, "_set_is_profiler_enabled", None)
        if setter is not None:
            setter(on)

    def _sync(self):
        """A few tiny ops, each between two clock reads: where Kineto's clock sits on ours
        (each op starts after its first read and ends before its second). Returns the
        reads, the monotonic ns right after, and the tick after the last op."""
        now, neg, t = recording.now, self.torch.neg, self._sync_tensor
        pairs = []
        for _ in range(SYNC_OPS):
            a = now()
            neg(t)
            pairs.append((a, now()))
        return pairs, time.monotonic_ns(), now()

    def _stop_kineto(self):
        with native_logs_dropped(KINETO_LOGS):
            result = self._autograd._disable_profiler()
        self._set_enabled(False)
        return result

    def _resume_gpu(self, w: Window) -> None:
        if w.cuda:
            gpu.resume_activity_tracing("stepscope's operator window", record_note=False)

    def abandon(self) -> None:
        """The program's own profiler is starting: give the profiler to it."""
        w, self.window = self.window, None
        if w is None:
            return
        safety.warn_once("torch-ops-yield", YIELD_MESSAGE)
        try:
            self._stop_kineto()
        finally:
            self._resume_gpu(w)
            StepTracker.ops_due = NEVER if self.steps_range else w.last + MIN_GAP

    def close(self, end: int, step: int) -> None:
        """Ends the window whose last step ended at tick ``end``; writes its ops."""
        w, self.window = self.window, None
        t0 = recording.now()
        try:
            sync_close = self._sync()
            result = self._stop_kineto()
        finally:
            self._resume_gpu(w)
        n = self.writer.write(result, w, sync_close, end)
        del result  # freeing Kineto's events costs as much again: inside the window's span
        t1 = recording.now()
        recording.span(FRAMEWORK, WINDOW_NAME, t0, t1)
        # cost: the window's wall time less what its steps would have taken unprofiled
        per_step = self.step_ticks(w.first, w.opened)
        steps = w.last - w.first + 1 if step < 0 else step - w.first
        cost = max((t1 - w.opened) - steps * per_step, t1 - t0)
        self.cost_ticks += cost
        self.stats.append({"first": w.first, "last": w.last, "ops": n, "cost_ticks": cost,
                           "close_ticks": t1 - t0, "window_ticks": t1 - w.opened})
        self.last_close = (step if step >= 0 else w.last + 1, t1)
        if step >= 0:
            self.plan_next(step, t1, per_step)
        elif self.steps_range is not None:  # a loop ended inside the range: the rest comes next epoch
            nxt = max(recording.current_step() + 1, w.first + 1)
            StepTracker.ops_due = nxt if nxt <= self.steps_range[1] else NEVER
        else:  # a loop ended or an eval loop began: the next train step decides
            StepTracker.ops_due = w.last + 1 + MIN_GAP

    # --- writing -----------------------------------------------------------------------


_windows: Optional[Windows] = None


def install(ctx) -> None:
    """Starts the windows for the instrumentor's session (patches through its registry).
    ``STEPSCOPE_OPS=0`` turns them off."""
    global _windows
    from stepscope.core import session

    if not config.flag("STEPSCOPE_OPS"):
        return

    current = session.current()
    try:
        windows = Windows(ctx.torch, current.config.steps if current is not None else None)
        from torch.profiler import profiler as tp
    except Exception as exc:  # noqa: BLE001 - a torch without these: no windows, phases as ever
        safety.warn_once("torch-ops", f"stepscope: operator windows are off ({type(exc).__name__}: {exc}); "
                                      "the program continues unaffected")
        return

    def wrap_start(original):
        def start(self, *args, **kwargs):
            user_profiler_starting()
            out = original(self, *args, **kwargs)
            if _windows is not None:  # counted once started: its stop() uncounts it
                _windows.user_profilers += 1
            return out

        return start

    def wrap_stop(original):
        def stop(self, *args, **kwargs):
            try:
                return original(self, *args, **kwargs)
            finally:
                if _windows is not None:
                    _windows.user_profilers = max(0, _windows.user_profilers - 1)

        return stop

    ctx.patch(tp.profile, "start", wrap_start)
    ctx.patch(tp.profile, "stop", wrap_stop)
    _windows = windows
    windows.install()
    session.on_stop(_session_stopping)


def _session_stopping() -> None:
    """A window still open when the session stops (its loop never ended) closes now."""
    w = _windows
    if w is not None and w.window is not None and w.window.thread == threading.get_ident():
        w.at_step(w.window.tracker, -1, recording.now())


def uninstall() -> None:
    global _windows
    if _windows is not None:
        _windows.uninstall()
        _windows = None


def user_profiler_starting() -> None:
    """The program's profiler is about to start: an open window ends first."""
    w = _windows
    if w is not None and w.window is not None:
        try:
            w.abandon()
        except Exception as exc:  # noqa: BLE001
            w.fail(exc)


def windows() -> Optional[Windows]:
    return _windows


