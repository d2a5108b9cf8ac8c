"""Python stack samples as decoded: each process's samples and stacks, with stack ids
mapped onto run-wide ones (what ``samples`` and ``stacks`` are built from)."""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

import numpy as np
import pandas as pd

from stepscope.analysis.store.reader import wall_offset
from stepscope.analysis.store.schema import STACK_COLUMNS
from stepscope.analysis.store.stacks import readable_samples, stack_validity

def raw_frames(procs) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """(raw samples, stacks) from decoded process traces (before their columns are released).
    Each process's stack ids are mapped onto run-wide ones: same frames, same id."""
    ids: Dict[tuple, int] = {}
    st_parent: List[int] = []
    st_depth: List[int] = []
    st_leaf: List[tuple] = []
    parts = []
    for p in procs:
        py = (p.columns or {}).get("py")
        if not py or not len(py["time"]):
            continue
        strings = list(py["strings"])
        ff, fl, fline = py["frame_func"], py["frame_file"], py["frame_line"]
        parents, frames = py["stack_parent"], py["stack_frame"]
        local = np.full(len(parents), -1, dtype=np.int64)
        valid = stack_validity(py)
        for i in np.flatnonzero(valid):  # a parent is always interned before its children
            fr = int(frames[i])
            par = int(parents[i])
            gpar = int(local[par]) if 0 <= par < i else -1
            leaf = (strings[ff[fr]], strings[fl[fr]], int(fline[fr]))
            key = (gpar, *leaf)
            gid = ids.get(key)
            if gid is None:
                gid = ids[key] = len(ids)
                st_parent.append(gpar)
                st_depth.append(st_depth[gpar] + 1 if gpar >= 0 else 0)
                st_leaf.append(leaf)
            local[i] = gid
        meta = p.meta
        rank = meta.get("rank") if meta.get("rank") is not None else meta.get("parent_rank")
        keep = readable_samples(py, valid)  # the samples whose stacks were lost are dropped (counted by the reader)
        n = int(keep.sum())
        if not n:
            continue
        tids = py["tid"].astype(np.int64)[keep]
        names = {int(k): str(v) for k, v in (meta.get("threads") or {}).items() if str(k).isdigit()}
        tid_set, where = np.unique(np.asarray(tids), return_inverse=True)
        thread = np.array([names.get(int(t), "") for t in tid_set], dtype=object)[where]
        parts.append(pd.DataFrame({
            "process": os.path.basename(p.folder), "pid": int(meta.get("pid", -1)),
            "rank": pd.array([rank] * n, dtype="Int64"),
            "tid": tids, "thread": thread,
            "time_ns": py["time"].astype(np.int64)[keep] + wall_offset(meta),
            "interval_ns": np.int64(py["interval_ns"] or 10_000_000),
            "stack": local[py["stack"].astype(np.int64)[keep]]}))
    stacks = pd.DataFrame({
        "stack": np.arange(len(st_parent), dtype=np.int64), "parent": np.array(st_parent, dtype=np.int64),
        "depth": np.array(st_depth, dtype=np.int64),
        "function": [f for f, _, _ in st_leaf], "file": [f for _, f, _ in st_leaf],
        "line": np.array([ln for _, _, ln in st_leaf], dtype=np.int64)}, columns=STACK_COLUMNS)
    raw = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {c: pd.Series(dtype=t) for c, t in [("process", "object"), ("pid", "int64"), ("rank", "Int64"),
                                             ("tid", "int64"), ("thread", "object"), ("time_ns", "int64"),
                                             ("interval_ns", "int64"), ("stack", "int64")]})
    raw["process"] = raw["process"].astype("category")
    raw["thread"] = raw["thread"].astype("category")
    return raw, stacks
