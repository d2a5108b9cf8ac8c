"""An operator window's events (``_ops.py``) written into the run: Kineto's CPU ops
as ``op`` spans on the threads that ran them, at ticks of stepscope's clock (the
window's clock markers place Kineto's clock on it), and, with CUDA, its kernels,
copies, memsets and runtime calls as GPU records with Kineto's correlation ids
(docs/format.md, "Operator spans")."""

from __future__ import annotations

import json
import re
import threading
from typing import TYPE_CHECKING

from stepscope.core import recording
from stepscope.core.recording import OP
from stepscope.core.vocabulary import pack_op_arg

if TYPE_CHECKING:
    from stepscope.integrations._steps import StepTracker


class Window:
    """One open Kineto session."""

    def __init__(self, tracker: StepTracker, first: int, last: int, opened: int):
        self.tracker = tracker
        self.first, self.last = first, last
        self.opened = opened  # tick: the open began (cost accounting)
        self.thread = threading.get_ident()
        self.cuda = False


SYNC_NAME = "aten::neg"  # the clock markers: tiny ops the window runs first and last
SYNC_OPS = 4
SHAPES_LIMIT = 300  # characters of an op's input dims kept


def pack_arg(seq: int, index: int) -> int:
    """An op span's argument (``vocabulary.pack_op_arg``): its input dims are an op
    counter named by them whose argument is the op's index (docs/format.md)."""
    return pack_op_arg(seq, index)


class OpWriter:
    """Writes the ops of each window of a process; interns their names and input dims once."""

    def __init__(self):
        self.shape_ids: dict = {}  # input dims -> interned id
        self.name_ids: dict = {}  # op name -> interned id
        self.index = 0  # ops written by this process
        self.ticks_per_ns = recording.clock_info()["ticks_per_ns"]
        self._main_tid = None

    def clock_map(self, events, sync_open, sync_close):
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
        to_tick = self.clock_map(events, w.sync_open, sync_close)
        if to_tick is None:
            return 0
        x_base, to_tick, from_tick = to_tick
        main_tid = self._main_tid
        lo, hi = from_tick(w.sync_open[2]), from_tick(end)  # the window's steps, on Kineto's clock less x_base
        span, counter, intern = recording.span, recording.counter, recording.intern
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
    span, counter = recording.span, recording.counter
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
