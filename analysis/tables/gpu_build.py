"""The GPU tables of one process from its raw records' columns (analysis/tables/gpu.py has the
what and why; this is the how, kept to array operations: a process may have hundreds of
millions of records).

The launch of a device record is found by correlation id in a sorted array, its step
and phase by binary search in the process's timeline, and every repeated string of
the two large tables (kernels, CUDA API calls) stays a categorical from the raw codes
to the Parquet dictionary. The small tables (memcpy, memset, sync) keep plain strings.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import pandas as pd

from stepscope.analysis.store import gpu_raw
from stepscope.analysis.tables import gpu
from stepscope.analysis.store.frames import concat, without_unused
from stepscope.analysis.store.schema import (API_COLUMNS, GPU_TABLES, KERNEL_COLUMNS, MEMCPY_COLUMNS, MEMSET_COLUMNS,
                                             SYNC_COLUMNS)
from stepscope.core import decoding


def gpu_tables(raw, steps: pd.DataFrame, phases: pd.DataFrame, other_api: Optional[list] = None,
               timeline: Optional["gpu.Timeline"] = None) -> dict:
    """{"kernels", "memcpy", "memset", "sync", "cuda_api"} from the raw GPU records
    (``gpu_raw.raw_columns`` of one process, or ``raw_frame``'s DataFrame of any number).
    ``other_api``: ``gpu_raw.api_keys`` of the parts of the same process's trace before
    and after this one, where the launches of device records near its ends may be."""
    cols = gpu_raw.columns_of(raw)
    timeline = timeline or gpu.Timeline(steps, phases)
    process = cols["process"]
    codes = np.asarray(process.codes)
    present = np.flatnonzero(np.bincount(codes, minlength=len(process.categories))) if len(codes) else []
    if len(present) <= 1:
        parts = [process_tables(cols, None, timeline, other_api)]
    else:
        parts = [process_tables(cols, np.flatnonzero(codes == c), timeline, None) for c in present]
    if len(parts) == 1:
        return parts[0]
    return {table: concat([p[table] for p in parts]) for table in GPU_TABLES}


def _names_and_precision(mangled: pd.Categorical):
    """(demangled name, precision) of each kernel (``mangled``: its categories all used),
    both categorical: demangled and classified once per distinct name."""
    plain_codes, plain_names = pd.factorize(pd.Index(decoding.demangle(list(map(str, mangled.categories))),
                                                     dtype=object))
    to_plain = np.append(plain_codes, -1)  # (a code of -1 stays -1)
    name_codes = to_plain[np.asarray(mangled.codes, dtype=np.int64)]
    unknown = gpu.PRECISIONS.index("unknown")
    precision = np.array([gpu.PRECISIONS.index(gpu.precision_of(n)) for n in plain_names] + [unknown], dtype=np.int64)
    return (pd.Categorical.from_codes(name_codes, list(plain_names)),
            pd.Categorical.from_codes(precision[name_codes], gpu.PRECISIONS))


def _take(values, rows):
    if rows is None:
        return values
    if isinstance(values, (pd.Categorical, pd.arrays.IntegerArray)):
        return values.take(rows)
    return values[rows]


def process_tables(cols: Dict[str, object], rows: Optional[np.ndarray], timeline: "gpu.Timeline",
                   other_api: Optional[list] = None) -> dict:
    """The five GPU tables of the records ``rows`` (None: all) of ``cols``, all of one process."""
    if rows is not None:
        cols = {c: (v if c == gpu_raw.CONFIGS else _take(v, rows)) for c, v in cols.items()}
    typ = cols["type"]
    process = cols["process"]
    name = process.categories[process.codes[0]] if len(typ) else None
    launches = gpu_raw.Launches([gpu_raw.api_keys(cols), *(other_api or [])])
    build = _Builder(cols, name, timeline, launches)
    kernels = build.kernels(np.flatnonzero(typ == 0))
    return {"kernels": kernels,
            "memcpy": build.memcpy(np.flatnonzero(typ == 1)),
            "memset": build.memset(np.flatnonzero(typ == 2)),
            "sync": build.sync(np.flatnonzero(typ == 3), kernels),
            "cuda_api": build.cuda_api(np.flatnonzero(typ >= gpu_raw.API_TYPES))}


class _Builder:
    def __init__(self, cols, process, timeline, launches):
        self.cols, self.process, self.timeline, self.launches = cols, process, timeline, launches

    def _common(self, rows: np.ndarray, columns: list) -> dict:
        c = self.cols
        out = {"process": c["process"].take(rows), "rank": c["rank"].take(rows), "pid": c["pid"][rows]}
        for k in ("device", "stream", "bytes", "thread", "correlation", "start_ns", "end_ns"):
            if k in columns:
                out[k] = c[k][rows]
        out["duration_ns"] = c["end_ns"][rows] - c["start_ns"][rows]
        return out

    def _launch(self, out: dict, rows: np.ndarray, categorical: bool, own_time: bool = False) -> None:
        """The launching call, launch latency, and (mode, step, phase) of the launch (of the
        record's own start for host-side records: syncs)."""
        L = self.launches
        at = L.find(self.cols["correlation"][rows])
        found = at >= 0
        safe = np.where(found, at, 0)
        start = L.start[safe] if len(L.start) else np.zeros(len(rows), dtype=np.int64)
        name_codes = np.where(found, L.name_codes[safe] if len(L.start) else -1, -1)
        if categorical:
            out["launch_api"] = without_unused(pd.Categorical.from_codes(name_codes, L.names))
        else:
            out["launch_api"] = np.asarray([*L.names, None], dtype=object)[name_codes]
        out["launch_start_ns"] = pd.arrays.IntegerArray(start.astype(np.int64), ~found)
        out["launch_latency_ns"] = pd.arrays.IntegerArray((out["start_ns"] - start).astype(np.int64), ~found)
        when = out["start_ns"] if own_time else np.where(found, start, -1)
        self._attribute(out, when, categorical)

    def _attribute(self, out: dict, when: np.ndarray, categorical: bool) -> None:
        if self.process is None:
            mode = phase = step = np.full(len(when), -1, dtype=np.int64)
        else:
            mode, step, phase = self.timeline.codes(self.process, when)
        out["mode"], out["phase"] = self.timeline.labels(mode, phase, categorical)
        out["step"] = step

    def kernels(self, rows: np.ndarray) -> pd.DataFrame:
        out = self._common(rows, KERNEL_COLUMNS)
        self._launch(out, rows, categorical=True)
        out["mangled"] = without_unused(self.cols["name"].take(rows))
        out["name"], out["precision"] = _names_and_precision(out["mangled"])
        out.update(zip(gpu_raw.CONFIG_FIELDS, gpu_raw.config_values(self.cols, rows)))
        return pd.DataFrame(out, columns=KERNEL_COLUMNS, copy=False)  # (no copy into 2-D blocks)

    def memcpy(self, rows: np.ndarray) -> pd.DataFrame:
        out = self._common(rows, MEMCPY_COLUMNS)
        self._launch(out, rows, categorical=False)
        m = pd.DataFrame(out)
        sub, sub2 = pd.Series(self.cols["sub"][rows]), pd.Series(self.cols["sub2"][rows])
        m["kind"] = sub.map(gpu.COPY_KINDS).fillna("unknown").to_numpy(dtype=object)
        m["src_memory"] = (sub2 & 15).map(gpu.MEMORY_KINDS).fillna("unknown").to_numpy(dtype=object)
        m["dst_memory"] = (sub2 // 16).map(gpu.MEMORY_KINDS).fillna("unknown").to_numpy(dtype=object)
        kind = m["kind"].astype(str)
        host_side = np.where(kind.str.startswith("H"), m["src_memory"].astype(str),
                             np.where(kind.str.endswith("H"), m["dst_memory"].astype(str), ""))
        # Whether the host side of the copy is pinned; NA for device-to-device copies.
        m["pinned"] = pd.arrays.BooleanArray(host_side == "pinned", host_side == "")
        dur = m["duration_ns"].to_numpy(dtype=float)
        m["bytes_per_s"] = np.where(dur > 0, m["bytes"].to_numpy(dtype=float) / np.where(dur > 0, dur, 1) * 1e9,
                                    np.nan)
        return m[MEMCPY_COLUMNS]

    def memset(self, rows: np.ndarray) -> pd.DataFrame:
        out = self._common(rows, MEMSET_COLUMNS)
        self._launch(out, rows, categorical=False)
        out["memory"] = pd.Series(self.cols["sub"][rows]).map(gpu.MEMORY_KINDS).fillna("unknown") \
            .to_numpy(dtype=object)
        return pd.DataFrame(out)[MEMSET_COLUMNS]

    def sync(self, rows: np.ndarray, kernels: pd.DataFrame) -> pd.DataFrame:
        out = self._common(rows, SYNC_COLUMNS)
        self._launch(out, rows, categorical=False, own_time=True)
        out["kind"] = pd.Series(self.cols["sub"][rows]).map(gpu.SYNC_TYPES).fillna("unknown").to_numpy(dtype=object)
        out["stream"] = np.where(out["stream"] != gpu.CONTEXT_STREAM, out["stream"], -1)
        y = pd.DataFrame(out)
        y["gpu_idle_after_ns"] = gpu.idle_after(y, kernels)
        return y[SYNC_COLUMNS]

    def cuda_api(self, rows: np.ndarray) -> pd.DataFrame:
        out = self._common(rows, API_COLUMNS)
        out["api"] = pd.Categorical.from_codes((self.cols["type"][rows] != 4).astype(np.int8), ["runtime", "driver"])
        out["name"] = without_unused(self.cols["name"].take(rows))
        self._attribute(out, out["start_ns"], categorical=True)
        return pd.DataFrame(out, columns=API_COLUMNS, copy=False)
