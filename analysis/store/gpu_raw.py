"""A process's GPU records as decoded: numpy columns, before attribution (analysis/tables/gpu.py).

The records of a GPU trace run to hundreds of millions per process, so they stay
plain arrays here: repeated strings (process, host, record name) as categoricals,
the launch configuration as an index into the process's table of distinct
configurations, expanded only for the kernels. ``raw_frame`` makes the
DataFrame the in-memory run keeps (``RAW_COLUMNS``); the dataset build takes
the columns as they are.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from stepscope.analysis.store.reader import names_with_placeholders, wall_offset

RAW_COLUMNS = ["process", "pid", "rank", "host", "type", "sub", "sub2", "device", "stream", "name", "correlation",
               "thread", "start_ns", "end_ns", "bytes", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
               "block_z", "registers", "static_smem", "dynamic_smem"]
CONFIG_FIELDS = RAW_COLUMNS[-9:]
API_TYPES = 4  # record types from here on are CUDA API calls (runtime, driver)
CONFIG, CONFIGS = "config", "configs"  # in columns: each record's configuration index, and the table


def empty_raw() -> pd.DataFrame:
    types = {"process": "object", "host": "object", "name": "object", "rank": "Int64"}
    return pd.DataFrame({c: pd.Series(dtype=types.get(c, "int64")) for c in RAW_COLUMNS})


def unique_names(names: List[str]):
    """(distinct names, code of each listed name among them): a names table may repeat a
    name (interned again after a fork), a categorical may not."""
    codes, uniques = pd.factorize(pd.Index(names, dtype=object))
    return list(uniques), codes.astype(np.int64)


def raw_columns(p) -> Optional[Dict[str, object]]:
    """One decoded process's GPU records as columns sorted by start (wall-clock ns, as
    events); None when it has none."""
    c = p.columns
    g = None if c is None else c.get("gpu")
    if g is None or len(g["type"]) == 0:
        return None
    n = len(g["type"])
    offset = wall_offset(p.meta)
    names, ids = names_with_placeholders(list(c["names"]), g["name"].astype(np.int64))
    names, remap = unique_names(names)
    start = g["start"] + offset
    order = None if np.all(start[1:] >= start[:-1]) else np.argsort(start, kind="stable")

    def col(a):  # in start order, as int64 (taken before widening: the decoded columns are narrow)
        return (a if order is None else a[order]).astype(np.int64, copy=False)

    configs = g["configs"].reshape(-1, 9).astype(np.int64)
    config, typ = col(g["config"]), col(g["type"])
    config[(typ != 0) | (config >= len(configs)) | (config < 0)] = -1
    rank = p.meta.get("rank") if p.meta.get("rank") is not None else p.meta.get("parent_rank")
    one = np.zeros(n, dtype=np.int8)
    return {
        "process": pd.Categorical.from_codes(one, [os.path.basename(p.folder)]),
        "pid": np.full(n, int(p.meta.get("pid", -1)), dtype=np.int64),
        "rank": pd.arrays.IntegerArray(np.full(n, -1 if rank is None else int(rank), dtype=np.int64),
                                       np.full(n, rank is None)),
        "host": pd.Categorical.from_codes(one, [str(p.meta.get("host", ""))]),
        "type": typ, "sub": col(g["sub"]), "sub2": col(g["sub2"]), "device": col(g["device"]),
        "stream": col(g["stream"]), "name": pd.Categorical.from_codes(remap[col(ids)], names),
        "correlation": col(g["correlation"]), "thread": col(g["thread"]), "start_ns": col(start),
        "end_ns": col(g["end"] + offset), "bytes": col(g["bytes"]),
        CONFIG: config, CONFIGS: configs,
    }


def config_values(cols: Dict[str, object], rows: np.ndarray) -> List[np.ndarray]:
    """The 9 launch configuration fields (``CONFIG_FIELDS``) of these records, a column
    each (zeros where a record has none)."""
    if CONFIG not in cols:
        return [np.asarray(cols[field])[rows] for field in CONFIG_FIELDS]
    table = np.zeros((9, len(cols[CONFIGS]) + 1), dtype=np.int64)  # the last entry: none
    table[:, :-1] = cols[CONFIGS].T
    cfg = cols[CONFIG][rows]
    return [field[cfg] for field in table]


def raw_frame(procs) -> pd.DataFrame:
    """Every process's GPU records (``RAW_COLUMNS``), process by process in the given
    order, each sorted by start."""
    parts = []
    for p in procs:
        cols = raw_columns(p)
        if cols is None:
            continue
        cfg = config_values(cols, np.arange(len(cols["type"])))
        frame = {c: cols[c] for c in RAW_COLUMNS if c in cols}
        frame.update(zip(CONFIG_FIELDS, cfg))
        parts.append(pd.DataFrame(frame, columns=RAW_COLUMNS, copy=False))
    if not parts:
        return empty_raw()
    if len(parts) == 1:
        return parts[0]
    from pandas.api.types import union_categoricals

    frame = pd.concat(parts, ignore_index=True)
    for c in ("process", "host", "name"):
        frame[c] = union_categoricals([part[c] for part in parts])
    return frame


def columns_of(raw) -> Dict[str, object]:
    """The columns of raw records given as ``raw_columns`` made them or as a DataFrame."""
    if isinstance(raw, dict):
        return raw
    out = {}
    for c in raw.columns:
        s = raw[c]
        if c in ("process", "host", "name"):
            out[c] = s.array if isinstance(s.dtype, pd.CategoricalDtype) else pd.Categorical(s.astype(object))
        elif c == "rank":
            out[c] = s.astype("Int64").array
        else:
            out[c] = s.to_numpy(dtype=np.int64)
    return out


def api_keys(cols: Dict[str, object]) -> Dict[str, object]:
    """What a device record takes of its launch call (correlation id, start, name), for the
    API records of these columns: kept for the parts of the trace beside this one."""
    rows = np.flatnonzero(cols["type"] >= API_TYPES)
    return {"correlation": cols["correlation"][rows], "start_ns": cols["start_ns"][rows],
            "name": cols["name"][rows]}


class Launches:
    """The launching API call of device records, by correlation id (one process): the
    first API record with that id, among this part's and the neighbouring parts'."""

    def __init__(self, keys: List[Dict[str, object]]):
        from pandas.api.types import union_categoricals

        keys = [k for k in keys if len(k["correlation"])]
        corr = np.concatenate([k["correlation"] for k in keys]) if keys else np.empty(0, dtype=np.int64)
        start = np.concatenate([k["start_ns"] for k in keys]) if keys else np.empty(0, dtype=np.int64)
        names = union_categoricals([pd.Categorical(k["name"]) for k in keys]) if keys \
            else pd.Categorical([], categories=[])
        order = np.argsort(corr, kind="stable")  # stable: the first record of an id comes first
        corr = corr[order]
        first = np.ones(len(corr), dtype=bool)
        first[1:] = corr[1:] != corr[:-1]
        order = order[first]
        self.correlation = corr[first]
        self.start = start[order]
        self.name_codes = np.asarray(names.codes)[order].astype(np.int64)
        self.names = list(names.categories)

    def find(self, correlation: np.ndarray) -> np.ndarray:
        """Index of each id's launch, -1 where none was recorded."""
        if not len(self.correlation):
            return np.full(len(correlation), -1, dtype=np.int64)
        at = np.searchsorted(self.correlation, correlation)
        safe = np.minimum(at, len(self.correlation) - 1)
        return np.where(self.correlation[safe] == correlation, safe, -1)
