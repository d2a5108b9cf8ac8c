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

import os
import re
from typing import List, Optional

import numpy as np
import pandas as pd

from stepscope.analysis.reader import wall_offset
from stepscope.core import _native
from stepscope.core import vocabulary as _v
from stepscope.core.vocabulary import CONTEXT_STREAM  # noqa: F401 - a sync record not about one stream

TYPES = _v.GPU_TYPES  # kernel, memcpy, memset, sync, runtime, driver
# CUPTI number -> name
COPY_KINDS = dict(enumerate(_v.COPY_KINDS))
MEMORY_KINDS = dict(enumerate(_v.MEMORY_KINDS))
SYNC_TYPES = dict(enumerate(_v.SYNC_TYPES))

RAW_COLUMNS = ["process", "pid", "rank", "host", "type", "sub", "sub2", "device", "stream", "name", "correlation",
               "thread", "start_ns", "end_ns", "bytes", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
               "block_z", "registers", "static_smem", "dynamic_smem"]
_CONFIG_FIELDS = RAW_COLUMNS[-9:]

TABLES = ("kernels", "memcpy", "memset", "sync", "cuda_api")
LAUNCH_KEYS = ["process", "correlation", "start_ns", "name"]
_ATTRIBUTION = ["launch_api", "launch_start_ns", "mode", "step", "phase"]
KERNEL_COLUMNS = ["process", "rank", "device", "stream", "name", "start_ns", "end_ns", "duration_ns",
                  "correlation", "step", "pid", "mode", "phase", "precision", "grid_x", "grid_y", "grid_z",
                  "block_x", "block_y", "block_z", "registers", "static_smem", "dynamic_smem", "launch_api",
                  "launch_start_ns", "launch_latency_ns", "mangled"]
MEMCPY_COLUMNS = ["process", "rank", "pid", "device", "stream", "kind", "bytes", "src_memory", "dst_memory",
                  "pinned", "start_ns", "end_ns", "duration_ns", "bytes_per_s", "correlation", *_ATTRIBUTION,
                  "launch_latency_ns"]
MEMSET_COLUMNS = ["process", "rank", "pid", "device", "stream", "bytes", "memory", "start_ns", "end_ns",
                  "duration_ns", "correlation", *_ATTRIBUTION, "launch_latency_ns"]
SYNC_COLUMNS = ["process", "rank", "pid", "device", "stream", "kind", "start_ns", "end_ns", "duration_ns",
                "correlation", *_ATTRIBUTION, "gpu_idle_after_ns"]
API_COLUMNS = ["process", "rank", "pid", "api", "thread", "name", "start_ns", "end_ns", "duration_ns",
               "correlation", "mode", "step", "phase"]


# --- raw records ------------------------------------------------------------------
def empty_raw() -> pd.DataFrame:
    types = {"process": "object", "host": "object", "name": "object", "rank": "Int64"}
    return pd.DataFrame({c: pd.Series(dtype=types.get(c, "int64")) for c in RAW_COLUMNS})


def raw_frame(procs) -> pd.DataFrame:
    """Every process's GPU records, times on the wall clock (epoch ns) like events."""
    parts = []
    for p in procs:
        c = p.columns
        g = None if c is None else c.get("gpu")
        if g is None or len(g["type"]) == 0:
            continue
        n = len(g["type"])
        offset = wall_offset(p.meta)
        names = list(c["names"])
        ids = g["name"].astype(np.int64)
        if int(ids.max()) >= len(names):  # a names chunk lost to damage
            names += [f"<name {i}>" for i in range(len(names), int(ids.max()) + 1)]
        configs = g["configs"].reshape(-1, 9).astype(np.int64)
        cfg = g["config"].astype(np.int64)
        has_cfg = (g["type"] == 0) & (cfg < len(configs))
        cfg_values = np.zeros((n, 9), dtype=np.int64)
        if has_cfg.any():
            cfg_values[has_cfg] = configs[cfg[has_cfg]]
        rank = p.meta.get("rank") if p.meta.get("rank") is not None else p.meta.get("parent_rank")
        # Repeated strings as categories from the start (no string per record: millions of them)
        one = np.zeros(n, dtype=np.int8)
        frame = pd.DataFrame({
            "process": pd.Categorical.from_codes(one, [os.path.basename(p.folder)]), "pid": int(p.meta.get("pid", -1)),
            "rank": pd.arrays.IntegerArray(np.full(n, -1 if rank is None else int(rank)), np.full(n, rank is None)),
            "host": pd.Categorical.from_codes(one, [str(p.meta.get("host", ""))]),
            "type": g["type"].astype(np.int64), "sub": g["sub"].astype(np.int64), "sub2": g["sub2"].astype(np.int64),
            "device": g["device"].astype(np.int64), "stream": g["stream"].astype(np.int64),
            "name": (pd.Categorical.from_codes(ids, names) if len(set(names)) == len(names)
                     else np.asarray(names, dtype=object)[ids]),
            "correlation": g["correlation"].astype(np.int64), "thread": g["thread"].astype(np.int64),
            "start_ns": g["start"] + offset, "end_ns": g["end"] + offset, "bytes": g["bytes"],
        })
        for i, col in enumerate(_CONFIG_FIELDS):
            frame[col] = cfg_values[:, i]
        parts.append(frame)
    if not parts:
        return empty_raw()
    raw = pd.concat(parts, ignore_index=True)
    return raw.sort_values(["process", "start_ns"], kind="stable").reset_index(drop=True)[RAW_COLUMNS]


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


def _classify(names: pd.Series) -> np.ndarray:
    if not len(names):
        return np.array([], dtype=object)
    cat = names.astype("category")
    classes = np.array([precision_of(n) for n in cat.cat.categories] + ["unknown"], dtype=object)
    return classes[cat.cat.codes.to_numpy()]


def _demangle(names: pd.Series) -> pd.Series:
    if not len(names):
        return pd.Series([], index=names.index, dtype=object)
    cat = names.astype("category")
    plain = np.array(_native.demangle(list(cat.cat.categories)) + [""], dtype=object)
    return pd.Series(plain[cat.cat.codes.to_numpy()], index=names.index)


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


class Timeline:
    """Per process, what ``attribute`` looks times up in: steps by start, and the
    innermost-phase segments (built once per process, for every GPU table)."""

    def __init__(self, steps: pd.DataFrame, phases: pd.DataFrame):
        self.steps, self.phases = steps, phases
        self._cache = {}

    def of(self, process):
        if process not in self._cache:
            s = self.steps[self.steps["process"] == process]
            step_index = None
            if len(s):
                order = np.argsort(s["start_ns"].to_numpy(), kind="stable")
                step_index = (s["start_ns"].to_numpy()[order], s["end_ns"].to_numpy()[order],
                              s["mode"].astype(str).to_numpy()[order], s["step"].to_numpy()[order])
            p = self.phases[self.phases["process"] == process]
            phase_index = None
            if len(p):
                seg_s, seg_e, idx = _innermost_segments(p["start_ns"].to_numpy(), p["end_ns"].to_numpy())
                phase_index = (seg_s, seg_e, p["name"].astype(str).to_numpy()[idx])
            self._cache[process] = (step_index, phase_index)
        return self._cache[process]


def attribute(processes: np.ndarray, times: np.ndarray, steps: pd.DataFrame, phases: pd.DataFrame,
              timeline: Optional[Timeline] = None):
    """(mode, step, phase) of each (process, host time): the step and the innermost phase
    of that process running at that time; None / -1 / None outside them."""
    timeline = timeline or Timeline(steps, phases)
    n = len(times)
    mode = np.full(n, None, dtype=object)
    step = np.full(n, -1, dtype=np.int64)
    phase = np.full(n, None, dtype=object)
    valid = times >= 0
    for process in pd.unique(processes):
        mine = np.flatnonzero((processes == process) & valid)
        if not len(mine):
            continue
        t = times[mine]
        step_index, phase_index = timeline.of(process)
        if step_index is not None:
            at = _lookup(step_index[0], step_index[1], t)
            hit = at >= 0
            mode[mine[hit]] = step_index[2][at[hit]]
            step[mine[hit]] = step_index[3][at[hit]]
        if phase_index is not None:
            at = _lookup(phase_index[0], phase_index[1], t)
            hit = at >= 0
            phase[mine[hit]] = phase_index[2][at[hit]]
    return mode, step, phase


# --- tables -------------------------------------------------------------------------
def _with_launch(part: pd.DataFrame, api: pd.DataFrame, steps, phases, own_time: bool = False,
                 timeline: Optional[Timeline] = None) -> pd.DataFrame:
    """Adds the launching API call (same process and correlation id), launch latency and
    (mode, step, phase): of the launch for device records, of their own start for
    host-side ones (syncs)."""
    out = part.copy()
    index = pd.MultiIndex.from_arrays([api["process"], api["correlation"]])
    at = index.get_indexer(pd.MultiIndex.from_arrays([out["process"], out["correlation"]])) \
        if len(api) and len(out) else np.full(len(out), -1)
    found = at >= 0
    safe = np.where(found, at, 0)
    launch_start = api["start_ns"].to_numpy()[safe] if len(api) else np.zeros(len(out), dtype=np.int64)
    out["launch_api"] = np.where(found, api["name"].to_numpy()[safe] if len(api) else None, None)
    out["launch_start_ns"] = pd.arrays.IntegerArray(launch_start.astype(np.int64), ~found)
    out["duration_ns"] = out["end_ns"] - out["start_ns"]
    out["launch_latency_ns"] = pd.arrays.IntegerArray((out["start_ns"].to_numpy() - launch_start).astype(np.int64),
                                                      ~found)
    when = out["start_ns"].to_numpy() if own_time else np.where(found, launch_start, -1)
    out["mode"], out["step"], out["phase"] = attribute(out["process"].to_numpy(), when, steps, phases, timeline)
    return out


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


def gpu_tables(raw: pd.DataFrame, steps: pd.DataFrame, phases: pd.DataFrame,
               other_api: Optional[pd.DataFrame] = None, timeline: Optional[Timeline] = None) -> dict:
    """{"kernels", "memcpy", "memset", "sync", "cuda_api"} from the raw GPU records.
    ``other_api``: API records (raw rows) of the parts of the trace before and after
    this one, where the launches of device records near its ends may be."""
    # Repeated strings as categories: row selections of millions of records stay cheap
    raw = raw.astype({c: "category" for c in ("process", "host", "name") if c in raw.columns})
    api = raw.loc[raw["type"] >= 4, LAUNCH_KEYS]  # what a device record takes of its launch
    if other_api is not None and len(other_api):
        api = pd.concat([api, other_api[LAUNCH_KEYS]], ignore_index=True)
        api = api.astype({c: "category" for c in ("process", "name")})
    launches = api.drop_duplicates(["process", "correlation"], keep="first").reset_index(drop=True)
    del api
    out = {}
    timeline = timeline or Timeline(steps, phases)

    k = _with_launch(raw[raw["type"] == 0], launches, steps, phases, timeline=timeline)
    k = k.rename(columns={"name": "mangled"})
    k["name"] = _demangle(k["mangled"])
    k["precision"] = _classify(k["name"])
    out["kernels"] = k[KERNEL_COLUMNS].reset_index(drop=True)

    m = _with_launch(raw[raw["type"] == 1], launches, steps, phases, timeline=timeline)
    m["kind"] = m["sub"].map(COPY_KINDS).fillna("unknown")
    m["src_memory"] = (m["sub2"] & 15).map(MEMORY_KINDS).fillna("unknown")
    m["dst_memory"] = (m["sub2"] // 16).map(MEMORY_KINDS).fillna("unknown")
    kind = m["kind"].astype(str)
    host_side = np.where(kind.str.startswith("H"), m["src_memory"].astype(str),
                         np.where(kind.str.endswith("H"), m["dst_memory"].astype(str), ""))
    # Whether the host side of the copy is pinned; NA for device-to-device copies.
    m["pinned"] = pd.arrays.BooleanArray(host_side == "pinned", host_side == "")
    dur = m["duration_ns"].to_numpy(dtype=float)
    m["bytes_per_s"] = np.where(dur > 0, m["bytes"].to_numpy(dtype=float) / np.where(dur > 0, dur, 1) * 1e9, np.nan)
    out["memcpy"] = m[MEMCPY_COLUMNS].reset_index(drop=True)

    s = _with_launch(raw[raw["type"] == 2], launches, steps, phases, timeline=timeline)
    s["memory"] = s["sub"].map(MEMORY_KINDS).fillna("unknown")
    out["memset"] = s[MEMSET_COLUMNS].reset_index(drop=True)

    y = _with_launch(raw[raw["type"] == 3], launches, steps, phases, own_time=True, timeline=timeline)
    y["kind"] = y["sub"].map(SYNC_TYPES).fillna("unknown")
    y["stream"] = y["stream"].where(y["stream"] != CONTEXT_STREAM, -1)
    y["gpu_idle_after_ns"] = idle_after(y, k)
    out["sync"] = y[SYNC_COLUMNS].reset_index(drop=True)

    a = raw[raw["type"] >= 4].copy()
    a["api"] = np.where(a["type"] == 4, "runtime", "driver")
    a["duration_ns"] = a["end_ns"] - a["start_ns"]
    a["mode"], a["step"], a["phase"] = attribute(a["process"].to_numpy(), a["start_ns"].to_numpy(), steps, phases,
                                                 timeline)
    out["cuda_api"] = a[API_COLUMNS].reset_index(drop=True)
    return out
