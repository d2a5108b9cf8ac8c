"""GPU activity as the report and the exports show it: one frame of device operations
(kernels, memcpy, memset, sync) and one of host launch calls, from whichever of the run's
GPU tables exist (``kernels``, ``memcpy``, ``memset``, ``sync``, ``cuda_api``; see
docs/format.md). Missing tables or columns are empty or defaulted, never an error.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.rules.gpudata import union_busy_ns

DEVICE_COLUMNS = ["process", "device", "stream", "kind", "name", "start_ns", "end_ns", "duration_ns", "correlation"]
LAUNCH_COLUMNS = ["process", "thread", "name", "start_ns", "end_ns", "correlation"]


def _table(run, name: str, during=None) -> pd.DataFrame:
    try:
        # a time selection reads only those rows of a large run's dataset
        frame = getattr(run, name) if during is None else run.gpu_select(name, during)
    except Exception:  # noqa: BLE001 - a table this build does not have, or cannot build
        return pd.DataFrame()
    return frame if isinstance(frame, pd.DataFrame) else pd.DataFrame()


def _column(frame: pd.DataFrame, name: str, default) -> pd.Series:
    if name in frame.columns:
        return frame[name]
    return pd.Series([default] * len(frame), index=frame.index)


KINDS = {"kernels": "kernel", "memcpy": "memcpy", "memset": "memset", "sync": "sync"}


def device_operations(run, kinds=tuple(KINDS.values()), during=None) -> pd.DataFrame:
    """Every operation that ran on a GPU, with kind kernel / memcpy / memset / sync
    (``kinds``: only these); ``during``: only those overlapping one of these times
    ([(start_ns, end_ns)])."""
    parts = []
    for table, kind in KINDS.items():
        if kind not in kinds:
            continue
        t = _table(run, table, during)
        if t.empty or "start_ns" not in t.columns or "end_ns" not in t.columns:
            continue
        if kind == "kernel":
            name = _column(t, "name", "kernel").astype(str)
        elif kind == "memcpy":
            name = "Memcpy " + _column(t, "kind", "").astype(str)
        elif kind == "memset":
            name = pd.Series("Memset", index=t.index)
        else:
            name = "Sync " + _column(t, "kind", "").astype(str)
        start, end = t["start_ns"].astype(np.int64), t["end_ns"].astype(np.int64)
        parts.append(pd.DataFrame({
            "process": _column(t, "process", "").astype(str).astype("category"),
            "device": _column(t, "device", 0).fillna(0).astype(int),
            "stream": _column(t, "stream", 0).fillna(0).astype(int), "kind": kind, "name": name.astype("category"),
            "start_ns": start, "end_ns": end, "duration_ns": end - start,
            "correlation": _column(t, "correlation", 0).fillna(0).astype(np.int64)}))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in DEVICE_COLUMNS})
    # few distinct processes, kinds and names over millions of operations: categoricals keep
    # every later selection, sort and group a matter of integer codes
    from pandas.api.types import union_categoricals

    out = pd.DataFrame({c: (union_categoricals([p[c].astype("category") for p in parts], ignore_order=True)
                            if c in ("process", "kind", "name") else np.concatenate([p[c].to_numpy() for p in parts]))
                        for c in parts[0].columns})
    return out.sort_values("start_ns", kind="stable", ignore_index=True)


def host_launches(run, during=None) -> pd.DataFrame:
    """CUDA runtime/driver calls on the host (cudaLaunchKernel, cudaMemcpyAsync, ...)."""
    t = _table(run, "cuda_api", during)
    if t.empty or "start_ns" not in t.columns:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in LAUNCH_COLUMNS})
    return pd.DataFrame({
        "process": _column(t, "process", "").astype(str), "thread": _column(t, "thread", 0).fillna(0).astype(np.int64),
        "name": _column(t, "name", "cuda call").astype(str), "start_ns": t["start_ns"].astype(np.int64),
        "end_ns": t["end_ns"].astype(np.int64), "correlation": _column(t, "correlation", 0).fillna(0).astype(np.int64),
    }).sort_values("start_ns", kind="stable", ignore_index=True)


def busy_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of intervals."""
    return int(union_busy_ns(np.zeros(len(start), dtype=np.int64), start, end).sum())
