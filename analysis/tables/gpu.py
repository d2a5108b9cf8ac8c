"""GPU activity tables: kernels, memcpy, memset, sync and the CUDA API calls
that launched them, from the GPU records of every process (format 1.1).

Attribution: a device record carries CUPTI's correlation id, which names the
API call that launched it (``cudaLaunchKernel``, ``cudaMemcpyAsync``...). The
launch call ran on the host, on the run's clock, so its start time places the
record in the step and the phase of its process that were running when it was
*launched*, whatever thread launched it (PyTorch launches backward kernels
from its autograd worker thread) and however late the GPU ran it. The
innermost phase wins (Recompute inside Backward). ``launch_latency_ns`` is
the kernel's start minus its launch call's start: how far ahead of the GPU the
host runs (large) or how starved the GPU is (small).

Precision (``precision``) is read from kernel names; see ``precision_of``.
"""

from __future__ import annotations

import re
from typing import List, Optional

import numpy as np
import pandas as pd

from stepscope.analysis.store.frames import without_unused
from stepscope.analysis.store.gpu_raw import RAW_COLUMNS, empty_raw, raw_frame  # noqa: F401 - the raw records' API
from stepscope.core import decoding
from stepscope.core import vocabulary as _v
from stepscope.core.vocabulary import CONTEXT_STREAM  # noqa: F401 - a sync record not about one stream

TYPES = _v.GPU_TYPES  # kernel, memcpy, memset, sync, runtime, driver
# CUPTI number -> name
COPY_KINDS = dict(enumerate(_v.COPY_KINDS))
MEMORY_KINDS = dict(enumerate(_v.MEMORY_KINDS))
SYNC_TYPES = dict(enumerate(_v.SYNC_TYPES))



# --- precision ----------------------------------------------------------------------
# Checked in this order, on the demangled name, case-insensitively: the first
# class whose pattern matches wins, so a mixed-precision GEMM named
# "..._bf16bf16_bf16f32_f32" is BF16 (its inputs), not FP32 (its accumulator).
PRECISION_PATTERNS = [
    ("FP8", r"fp8|e4m3|e5m2|f8f8|float8|__nv_fp8"),
    ("INT8", r"int8|i8i8|s8s8|imma|signed char|_i8_|u8s8|s8u8"),
    ("BF16", r"bf16|bfloat16"),
    ("FP16", r"fp16|f16f16|c10::half|__half|\bhalf\b|hmma|h884|h1688|h16816|_f16_"),
    ("TF32", r"tf32"),
    ("FP64", r"fp64|dgemm|\bdouble\b|d884|dmma"),
    ("FP32", r"fp32|f32f32|sgemm|\bfloat\b|s1688|s884|_f32_|scudnn|gemmsn"),
]
_PRECISION_RE = [(cls, re.compile(p, re.IGNORECASE)) for cls, p in PRECISION_PATTERNS]


def precision_of(name: str) -> str:
    """FP8, INT8, BF16, FP16, TF32, FP64, FP32 or "unknown", from a kernel's name.

    Names are all there is: a kernel's class is the data type its name
    mentions (template arguments such as ``c10::BFloat16``, cuBLAS/CUTLASS
    codes such as ``sgemm``, ``s16816gemm_bf16``, ``f16f16_f16f32``), which for
    elementwise kernels is the data type moved, not arithmetic done. cuBLAS may
    run an "sgemm"-named FP32 GEMM on TF32 tensor cores when TF32 is allowed
    without saying so in the name; custom kernels (Triton's ``triton_poi_...``,
    hand-written ones) rarely name a type and are "unknown".
    """
    for cls, pattern in _PRECISION_RE:
        if pattern.search(name):
            return cls
    return "unknown"


PRECISIONS = [cls for cls, _ in PRECISION_PATTERNS] + ["unknown"]


# --- attribution --------------------------------------------------------------------
def _innermost_segments(start: np.ndarray, end: np.ndarray):
    """Phase spans (of one process) as non-overlapping segments naming the innermost
    span that covers them: (seg_start, seg_end, span index).

    Spans that overlap nothing before them (most phases: one after the other) are
    their own segment; only groups of overlapping spans (an LBFGS step's Forward
    inside its Optimizer, clock rounding between neighbours) are walked one by one."""
    order = np.lexsort((start - end, start))  # by start, longer first
    s, e = start[order], end[order]
    if len(s) < 2 or np.all(s[1:] >= e[:-1]):
        keep = e > s  # an empty span covers no time (and would hide its neighbour from the lookup)
        return s[keep], e[keep], order[keep]
    reach = np.maximum.accumulate(e)
    alone = np.ones(len(s), dtype=bool)  # a group boundary: nothing open when the span starts
    alone[1:] = s[1:] >= reach[:-1]
    first = np.flatnonzero(alone)
    size = np.diff(np.append(first, len(s)))
    single = first[size == 1]
    single = single[e[single] > s[single]]
    seg_s, seg_e, seg_i = [s[single]], [e[single]], [order[single]]
    for a, n in zip(first[size > 1], size[size > 1]):
        gs, ge, gi = _walk(s[a:a + n], e[a:a + n], order[a:a + n])
        seg_s.append(gs)
        seg_e.append(ge)
        seg_i.append(gi)
    seg_s, seg_e, seg_i = np.concatenate(seg_s), np.concatenate(seg_e), np.concatenate(seg_i)
    by = np.argsort(seg_s, kind="stable")
    return seg_s[by], seg_e[by], seg_i[by]


def _walk(s: np.ndarray, e: np.ndarray, order: np.ndarray):
    """The segments of one group of overlapping spans (sorted by start, longer first)."""
    seg_s, seg_e, seg_i = [], [], []
    stack: List[int] = []  # open spans, outermost first
    cursor = s[0]

    def emit(upto):
        nonlocal cursor
        if stack and upto > cursor:
            seg_s.append(cursor)
            seg_e.append(upto)
            seg_i.append(order[stack[-1]])
        cursor = max(cursor, upto)

    for i in range(len(s)):
        while stack and e[stack[-1]] <= s[i]:
            emit(e[stack[-1]])
            stack.pop()
        emit(s[i])
        cursor = s[i]
        stack.append(i)
    while stack:
        emit(e[stack[-1]])
        stack.pop()
    return np.array(seg_s, dtype=np.int64), np.array(seg_e, dtype=np.int64), np.array(seg_i, dtype=np.int64)


def _lookup(seg_start, seg_end, times):
    where = np.searchsorted(seg_start, times, side="right") - 1
    safe = np.clip(where, 0, None)
    ok = (where >= 0) & (times < seg_end[safe]) if len(seg_start) else np.zeros(len(times), dtype=bool)
    return np.where(ok, safe, -1)


def _categories(values, known) -> list:
    """The distinct values, those of ``known`` first in its order, the rest sorted."""
    if isinstance(values.dtype, pd.CategoricalDtype):  # the used categories: no object copy of millions of rows
        values = without_unused(values.array).categories
    seen = {str(v) for v in pd.unique(np.asarray(values, dtype=object)) if v is not None and not pd.isna(v)}
    return [k for k in known if k in seen] + sorted(seen - set(known))


class Timeline:
    """Per process, what ``attribute`` looks times up in: steps by start, and the
    innermost-phase segments (built once per process, for every GPU table). Modes
    and phases are codes into ``modes`` and ``phase_names``, the same for every process."""

    def __init__(self, steps: pd.DataFrame, phases: pd.DataFrame):
        self.steps, self.phases = steps, phases
        self.modes = _categories(steps["mode"], _v.MODES)
        self.phase_names = _categories(phases["name"], _v.PHASES)
        self._cache = {}

    def of(self, process):
        if process not in self._cache:
            s = self.steps[self.steps["process"] == process]
            step_index = None
            if len(s):
                order = np.argsort(s["start_ns"].to_numpy(), kind="stable")
                mode = pd.Categorical(s["mode"].astype(object), categories=self.modes).codes
                step_index = (s["start_ns"].to_numpy(np.int64)[order], s["end_ns"].to_numpy(np.int64)[order],
                              np.asarray(mode, dtype=np.int64)[order], s["step"].to_numpy(np.int64)[order])
            p = self.phases[self.phases["process"] == process]
            phase_index = None
            if len(p):  # (native: ``_innermost_segments`` defines it, tests hold the two equal)
                seg_s, seg_e, idx = decoding.innermost_segments(p["start_ns"].to_numpy(np.int64),
                                                                p["end_ns"].to_numpy(np.int64))
                name = pd.Categorical(p["name"].astype(object), categories=self.phase_names).codes
                phase_index = (seg_s, seg_e, np.asarray(name, dtype=np.int64)[idx])
            self._cache[process] = (step_index, phase_index)
        return self._cache[process]

    def codes(self, process, times: np.ndarray):
        """(mode code, step, phase code) at each time of one process; -1 outside (or time < 0):
        ``_lookup`` in the steps and in the innermost segments, done natively (one search per
        time, from the last one's place: a GPU table's times mostly increase)."""
        n = len(times)
        step_index, phase_index = self.of(process)
        times = np.ascontiguousarray(times, dtype=np.int64)
        if step_index is not None:
            mode, step = decoding.attribute(step_index[0], step_index[1], [step_index[2], step_index[3]], times)
        else:
            mode, step = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        if phase_index is not None:
            phase, = decoding.attribute(phase_index[0], phase_index[1], [phase_index[2]], times)
        else:
            phase = np.full(n, -1, dtype=np.int64)
        return mode, step, phase

    def labels(self, mode: np.ndarray, phase: np.ndarray, categorical: bool):
        """The codes as categoricals (large tables) or as strings with None (small ones)."""
        if categorical:
            return pd.Categorical.from_codes(mode, self.modes), pd.Categorical.from_codes(phase, self.phase_names)
        return (np.asarray([*self.modes, None], dtype=object)[mode],
                np.asarray([*self.phase_names, None], dtype=object)[phase])


def attribute(processes: np.ndarray, times: np.ndarray, steps: pd.DataFrame, phases: pd.DataFrame,
              timeline: Optional[Timeline] = None):
    """(mode, step, phase) of each (process, host time): the step and the innermost phase
    of that process running at that time; None / -1 / None outside them."""
    timeline = timeline or Timeline(steps, phases)
    n = len(times)
    mode = np.full(n, -1, dtype=np.int64)
    step = np.full(n, -1, dtype=np.int64)
    phase = np.full(n, -1, dtype=np.int64)
    for process in pd.unique(processes):
        mine = np.flatnonzero(processes == process)
        mode[mine], step[mine], phase[mine] = timeline.codes(process, times[mine])
    mode, phase = timeline.labels(mode, phase, categorical=False)
    return mode, step, phase


# --- tables -------------------------------------------------------------------------
def idle_after(sync: pd.DataFrame, kernels: pd.DataFrame) -> np.ndarray:
    """Per sync, the GPU time lost to it: from its end (the GPU has drained) to the start
    of the process's next kernel. Syncs with no kernel between them share one gap: it
    goes to the first of them to end, the others get 0."""
    out = np.zeros(len(sync), dtype=np.int64)
    if not len(sync) or not len(kernels):
        return out
    for process in pd.unique(sync["process"]):
        rows = np.flatnonzero((sync["process"] == process).to_numpy())
        mine = kernels["process"] == process
        if not mine.any():
            continue
        starts = np.sort(kernels["start_ns"].to_numpy(dtype=np.int64)[mine.to_numpy()])
        ends = sync["end_ns"].to_numpy(dtype=np.int64)[rows]
        nxt = np.searchsorted(starts, ends, side="left")
        keep = np.flatnonzero(nxt < len(starts))
        if not len(keep):
            continue
        # the first sync (by end) before each next kernel carries the gap
        order = keep[np.lexsort((ends[keep], nxt[keep]))]
        first = np.ones(len(order), dtype=bool)
        first[1:] = nxt[order][1:] != nxt[order][:-1]
        at = order[first]
        out[rows[at]] = np.clip(starts[nxt[at]] - ends[at], 0, None)
    return out
