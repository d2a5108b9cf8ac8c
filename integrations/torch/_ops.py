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
launched them, so ``analysis/ops.py`` links kernels to operators.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import List, Optional, Tuple

from stepscope.core import _native, gpu, safety
from stepscope.core.quiet import native_logs_dropped
from stepscope.core.vocabulary import TORCH_OP_WINDOW, TORCH_OP_WINDOW_OPEN, pack_op_arg
from stepscope.integrations._steps import StepTracker

OP = _native.CATEGORIES.index("op")
FRAMEWORK = _native.CATEGORIES.index("framework")
WINDOW_NAME = _native.intern(TORCH_OP_WINDOW)
OPEN_NAME = _native.intern(TORCH_OP_WINDOW_OPEN)
SYNC_NAME = "aten::neg"  # the clock markers: tiny ops the window runs first and last
SYNC_OPS = 4
NEVER = 1 << 62

EARLY = (5, 3)  # first window: train steps 5..7
CALIBRATE = 2  # the step whose begin times the steps before the first window
LENGTH = 2  # steps of every later window
BUDGET = 0.01  # windows' share of the run's time
MIN_GAP = 50  # steps between windows, at least
SHAPES_LIMIT = 300  # characters of an op's input dims kept

# Kineto logs its session's start and stop on stderr, which is the job's.
KINETO_LOGS = re.compile(rb"^(?:USDT|STAGE|INFO|WARNING):\S* \S+ \d+:\d+ \S*ActivityProfiler\S*\.cpp")
YIELD_MESSAGE = ("stepscope: the program started torch's profiler; stepscope ends its operator window and "
                 "opens none while it runs, the program continues unaffected")


def pack_arg(seq: int, index: int) -> int:
    """An op span's argument (``vocabulary.pack_op_arg``): its input dims are an op
    counter named by them whose argument is the op's index (docs/format.md)."""
    return pack_op_arg(seq, index)


class Window:
    """One open Kineto session."""

    def __init__(self, tracker: StepTracker, first: int, last: int, opened: int):
        self.tracker = tracker
        self.first, self.last = first, last
        self.opened = opened  # tick: the open began (cost accounting)
        self.thread = threading.get_ident()
        self.cuda = False


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
        self.shape_ids: dict = {}  # input dims -> interned id
        self.name_ids: dict = {}  # op name -> interned id
        self.index = 0  # ops written by this process
        self.ticks_per_ns = _native.clock_info()["ticks_per_ns"]
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
                self.last_close = (step, _native.now())  # the step time before the first window
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
        now = _native.now()
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
        _native.span(FRAMEWORK, OPEN_NAME, now, _native.now())
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
        now, neg, t = _native.now, self.torch.neg, self._sync_tensor
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
        t0 = _native.now()
        try:
            sync_close = self._sync()
            result = self._stop_kineto()
        finally:
            self._resume_gpu(w)
        n = self.write(result, w, sync_close, end)
        del result  # freeing Kineto's events costs as much again: inside the window's span
        t1 = _native.now()
        _native.span(FRAMEWORK, WINDOW_NAME, t0, t1)
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
            nxt = max(_native.current_step() + 1, w.first + 1)
            StepTracker.ops_due = nxt if nxt <= self.steps_range[1] else NEVER
        else:  # a loop ended or an eval loop began: the next train step decides
            StepTracker.ops_due = w.last + 1 + MIN_GAP

    # --- writing -----------------------------------------------------------------------
    def _clock_map(self, events, sync_open, sync_close):
        """(x_base, to_tick, from_tick): Kineto's ns (less x_base) to ticks and back, the
        line through the open and close markers, each placed within its clock reads."""
        markers = sorted((e for e in events if e.name() == SYNC_NAME), key=lambda e: e.start_ns())
        if len(markers) < 2 * SYNC_OPS:
            return None
        self._main_tid = markers[0].start_thread_id()
        x_base = markers[0].start_ns()
        tpn = self.ticks_per_ns

        def anchor(pairs, evs):
            """(x, ns offset): a marker's Kineto start and T - x where T = ticks / tpn,
            between the tightest bounds all markers give."""
            t_base = pairs[0][0]
            low = max((a - t_base) / tpn - (e.start_ns() - x_base) for (a, _), e in zip(pairs, evs))
            high = min((b - t_base) / tpn - (e.end_ns() - x_base) for (_, b), e in zip(pairs, evs))
            return evs[0].start_ns() - x_base, t_base, (low + high) / 2

        x0, t0, c0 = anchor(sync_open[0], markers[:SYNC_OPS])
        x1, t1, c1 = anchor(sync_close[0], markers[-SYNC_OPS:])
        # T(x) - t0/tpn = x + c(x), c linear between the anchors (the two clocks' rates differ slightly)
        c1 += (t1 - t0) / tpn
        slope = (c1 - c0) / (x1 - x0) if x1 > x0 else 0.0

        def to_tick(x):
            return int(t0 + (x + c0 + (x - x0) * slope) * tpn)

        def from_tick(tick):
            return ((tick - t0) / tpn - c0 + x0 * slope) / (1 + slope)

        return x_base, to_tick, from_tick

    def write(self, result, w: Window, sync_close, end: int) -> int:
        """Writes the window's ops (those that began before ``end``) as op spans;
        returns their number."""
        events = result.events()
        to_tick = self._clock_map(events, w.sync_open, sync_close)
        if to_tick is None:
            return 0
        x_base, to_tick, from_tick = to_tick
        main_tid = self._main_tid
        lo, hi = from_tick(w.sync_open[2]), from_tick(end)  # the window's steps, on Kineto's clock less x_base
        span, counter, intern = _native.span, _native.counter, _native.intern
        shape_ids, name_ids = self.shape_ids, self.name_ids
        mine, foreign, device, calls, thread_of_op = 0, {}, [], [], {}
        for e in events:
            if w.cuda:  # Kineto's CUDA activity: written back as GPU records below
                kind = _kind(e)
                if kind in DEVICE_KINDS:
                    device.append(e)
                    continue
                if kind in CALL_KINDS:
                    calls.append(e)
                    continue
            start = e.start_ns() - x_base
            if start < lo or start >= hi or e.is_async():
                continue
            name = e.name()
            nid = name_ids.get(name)
            if nid is None:
                nid = name_ids[name] = intern(name)
            shapes = e.shapes()
            sid = -1
            if shapes and any(shapes):
                key = str(shapes)
                sid = shape_ids.get(key)
                if sid is None:
                    sid = shape_ids[key] = intern(key[:SHAPES_LIMIT])
            t0 = to_tick(start)
            self.index += 1
            record = (OP, nid, t0, max(to_tick(e.end_ns() - x_base), t0),
                      pack_arg(e.sequence_nr(), self.index), sid, self.index)
            thread = e.start_thread_id()
            if w.cuda:
                thread_of_op[e.correlation_id()] = thread
            if thread == main_tid:
                span(*record[:5])
                if sid >= 0:
                    counter(OP, sid, 0.0, self.index, t0)
                mine += 1
            else:  # an autograd device thread: a track of its own keeps nesting true
                foreign.setdefault(thread, []).append(record)
        mono = _monotonic(w, to_tick, x_base, self.ticks_per_ns) if w.cuda else None
        # each CUDA call goes with the thread of the op that made it (Kineto links them)
        by_thread: dict = {}
        for c in calls:
            by_thread.setdefault(thread_of_op.get(c.linked_correlation_id(), main_tid), []).append(c)
        if mono is not None:
            _write_calls(by_thread.pop(main_tid, []), mono)
        for thread, records in foreign.items():
            helper = threading.Thread(target=_write_all, args=(records, by_thread.pop(thread, []), mono),
                                      name="stepscope-ops", daemon=True)
            helper.start()
            helper.join()
            mine += len(records)
        if mono is not None:
            for rest in by_thread.values():  # calls of a thread with no op in the window
                _write_calls(rest, mono)
            _write_device(device, mono)
        return mine


DEVICE_KINDS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"}  # Kineto's activity names
CALL_KINDS = {"cuda_runtime", "cuda_driver"}
MEMCPY = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
MEMORY = {"Pageable": "pageable", "Pinned": "pinned", "Device": "device", "Managed": "managed"}
CUDA_CALL = re.compile(r"cu(da)?[A-Z]\w*$")  # cudaLaunchKernel (runtime), cuLaunchKernel (driver)
BYTES = re.compile(r'"bytes": *(\d+)')
SYNCS = {"Event Sync": "event_synchronize", "Stream Wait Event": "stream_wait_event",  # Kineto's names
         "Stream Sync": "stream_synchronize", "Context Sync": "context_synchronize"}


def _kind(e) -> str:
    """Kineto's activity type of an event. A torch without ``activity_type()`` (2.11
    has none; seen on an H200): device events are told by name (a GPU annotation is
    flagged as one), runtime and driver calls by name."""
    get = getattr(e, "activity_type", None)
    if get is not None:
        return get()
    name = e.name()
    if name in SYNCS:
        return "cuda_sync"
    if str(e.device_type()).endswith("CUDA"):
        if name.startswith("Memcpy"):
            return "gpu_memcpy"
        if name.startswith("Memset"):
            return "gpu_memset"
        return "gpu_user_annotation" if e.is_user_annotation() else "kernel"
    if CUDA_CALL.match(name):
        return "cuda_runtime" if name.startswith("cuda") else "cuda_driver"
    return "cpu_op"


def _launch_config(e) -> dict:
    """A kernel's grid, block, registers and shared memory from Kineto's metadata
    (``"grid": [x, y, z], "block": [...], "registers per thread": n, "shared memory": n``,
    the last static and dynamic together); nothing where the metadata lacks them."""
    try:
        meta = json.loads("{" + (e.metadata_json() or "") + "}")
        return {"grid": tuple(int(v) for v in meta["grid"]), "block": tuple(int(v) for v in meta["block"]),
                "registers": int(meta.get("registers per thread", 0)),
                "dynamic_smem": int(meta.get("shared memory", 0))}
    except Exception:  # noqa: BLE001 - no metadata (an older torch), or another shape of it
        return {}


def _nbytes(e) -> int:
    """Bytes a copy or memset moved: ``nbytes()`` where torch has it, else its metadata."""
    get = getattr(e, "nbytes", None)
    n = int(get() or 0) if get is not None else 0
    if n == 0 and hasattr(e, "metadata_json"):
        m = BYTES.search(e.metadata_json() or "")
        n = int(m.group(1)) if m else 0
    return n


def _monotonic(w: Window, to_tick, x_base: int, tpn: float):
    """Kineto's ns to monotonic ns (GPU records' clock): the open markers' last read
    came just before ``w.sync_open[1]``."""
    t_ref, m_ref = w.sync_open[0][-1][1], w.sync_open[1]

    def mono(x):
        return int(m_ref + (to_tick(x - x_base) - t_ref) / tpn)

    return mono


def _write_all(records, calls=(), mono=None) -> None:
    """A foreign thread's ops (and its CUDA calls), written from a thread of their own."""
    span, counter = _native.span, _native.counter
    for record in records:
        span(*record[:5])
        if record[5] >= 0:
            counter(OP, record[5], 0.0, record[6], record[2])
    if calls and mono is not None:
        _write_calls(calls, mono)


def _write_calls(calls, mono) -> None:
    """CUDA runtime/driver calls as stepscope's, on the writing thread's id, so that the
    ops written on that thread contain them."""
    from stepscope.core import gpu_records

    tid = threading.get_native_id()
    for c in calls:
        gpu_records.api(c.name(), mono(c.start_ns()), mono(c.end_ns()), c.correlation_id(), thread=tid,
                        driver=_kind(c) == "cuda_driver")


def _write_device(events, mono) -> None:
    """Kineto's kernels, copies and memsets of a window as stepscope GPU records, with
    Kineto's (CUPTI's) correlation ids."""
    from stepscope.core import gpu_records

    for e in events:
        kind, t0, t1, corr = _kind(e), mono(e.start_ns()), mono(e.end_ns()), e.correlation_id()
        where = {"device": e.device_index(), "stream": e.device_resource_id()}
        nbytes = _nbytes(e)
        if kind == "kernel":
            gpu_records.kernel(e.name(), t0, t1, corr, **where, **_launch_config(e))
        elif kind == "gpu_memcpy":
            m = MEMCPY.search(e.name())
            copy = m.group(1) if m and m.group(1) in gpu_records.COPY_KINDS else "HtoD"
            src = MEMORY.get(m.group(2), "pageable") if m else "pageable"
            dst = MEMORY.get(m.group(3), "device") if m else "device"
            gpu_records.memcpy(copy, nbytes, t0, t1, corr, src=src, dst=dst, **where)
        elif kind == "gpu_memset":
            gpu_records.memset(nbytes, t0, t1, corr, **where)
        else:
            sync = SYNCS.get(e.name(), "unknown")
            if sync not in ("stream_synchronize", "stream_wait_event"):
                where["stream"] = gpu_records.CONTEXT_STREAM
            gpu_records.sync(sync, t0, t1, corr, **where)


_windows: Optional[Windows] = None


def install(inst, torch) -> None:
    """Starts the windows for the instrumentor's session (patches through its registry).
    ``STEPSCOPE_OPS=0`` turns them off."""
    global _windows
    from stepscope.core import session

    if os.environ.get("STEPSCOPE_OPS", "").strip().lower() in ("0", "off", "false", "no"):
        return

    current = session.current()
    try:
        windows = Windows(torch, current.config.steps if current is not None else None)
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

    inst.patch(tp.profile, "start", wrap_start)
    inst.patch(tp.profile, "stop", wrap_stop)
    _windows = windows
    windows.install()
    session.on_stop(_session_stopping)


def _session_stopping() -> None:
    """A window still open when the session stops (its loop never ended) closes now."""
    w = _windows
    if w is not None and w.window is not None and w.window.thread == threading.get_ident():
        w.at_step(w.window.tracker, -1, _native.now())


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


