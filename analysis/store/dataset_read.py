"""A run's Parquet dataset, read: a table, or a selection of events, at a time.

What ``Run`` reads when the run is large (docs/format.md has the layout, a contract
DuckDB, Spark and Trino read as it is). Reading needs no table builder: the tables
with no rows come from the store that opens the dataset (``Dataset(empty_tables=...)``).
"""

from __future__ import annotations

import json
import os
from typing import Callable, Dict, Iterable, List, Optional

import numpy as np
import pandas as pd

from stepscope.analysis.store.reader import start_order
from stepscope.analysis.store.dataset_files import COLUMNS_KEY, PARTITION, partition_dir
from stepscope.analysis.store.frames import concat, without_unused
from stepscope.analysis.store.py_samples import raw_frames
from stepscope.analysis.store.schema import STACK_COLUMNS

# Columns that are categorical in the in-memory tables (kept categorical on read).
_CATEGORICAL_PROCESS = {"events", "steps", "phases"}


def files_of(root: str, table: str, partitions: Iterable[str]) -> List[tuple]:
    """(partition, file) of a table's files, in the given process order."""
    out = []
    for part in partitions:
        d = partition_dir(root, table, part)
        if os.path.isdir(d):
            out.extend((part, os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith(".parquet"))
    return out


def read_table(root: str, table: str, processes: List[str], partitions: List[str],
               filter=None, columns: Optional[List[str]] = None, keep_file=None) -> Optional[pd.DataFrame]:
    """A table as pandas (``processes``: folder names, in the run's order;
    ``partitions``: their partition names). ``filter``: a pyarrow compute
    expression applied while reading (row groups it excludes are skipped);
    ``keep_file(partition, path)``: False for files known to hold none of the rows
    wanted. None when no process has rows in it."""
    import pyarrow.dataset as ds

    code_of = {part: i for i, part in enumerate(partitions)}
    parts, files = [], files_of(root, table, partitions)
    if filter is None:
        kept = [(part, path) for part, path in files if keep_file is None or keep_file(part, path)]
        frame, dtype = _read_files(kept, columns, code_of, processes) if len(kept) > 1 else (None, "")
        if frame is not None:
            return _finish(frame, table, files, dtype)
    for part, path in files:
        if keep_file is not None and not keep_file(part, path):
            continue
        data = ds.dataset(path, format="parquet")
        names = data.schema.names if columns is None else [c for c in columns if c in data.schema.names]
        frame = _to_pandas(data, names, filter)
        if filter is not None and not len(frame):
            continue
        order = json.loads((data.schema.metadata or {}).get(COLUMNS_KEY, b"[]")) or [""]
        dtype = order.pop()
        if columns is None or PARTITION in columns:
            at = order.index(PARTITION) if PARTITION in order else 0
            frame.insert(min(at, len(frame.columns)), PARTITION, pd.Categorical.from_codes(
                np.full(len(frame), code_of[part], dtype=np.int32), categories=processes))
        parts.append(frame)
    if not parts:
        return None
    return _finish(parts[0] if len(parts) == 1 else concat(parts), table, files, dtype)


def _finish(frame: pd.DataFrame, table: str, files: List[tuple], dtype: str) -> pd.DataFrame:
    """The table as the in-memory store has it: a process decoded in parts in start order
    again, the process column with the dtype it has there."""
    if table == "events" and len(files) > len({part for part, _ in files}) \
            and {PARTITION, "start_ns", "end_ns"} <= set(frame.columns):
        # a process decoded in parts: its events in start order again, as when decoded at once
        frame = frame.iloc[_order_within(frame, start_order)].reset_index(drop=True)
    if PARTITION not in frame.columns:
        pass
    elif table in _CATEGORICAL_PROCESS or dtype == "category":
        frame[PARTITION] = without_unused(frame[PARTITION].array)
    elif dtype:  # the dtype the in-memory table has (object or str)
        frame[PARTITION] = frame[PARTITION].astype(dtype)
    return frame


SMALL_FILE_ROWS = 1 << 16


def _read_files(files: List[tuple], columns, code_of: dict, processes: List[str]):
    """(frame, process dtype) of several whole files, a column at a time across all of
    them: Arrow reads each column's pieces, and pandas gets the column in one piece (no
    concatenation of frames afterwards, and the peak is the frame plus one column).
    (None, "") where the files' columns differ (the reader then takes a file at a time)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        first = pq.read_schema(files[0][1])
        names = first.names if columns is None else [c for c in columns if c in first.names]
        meta = first.pandas_metadata or {}
        opened = [pq.ParquetFile(path) for _, path in files]  # (each file's footer read once)
        rows = [f.metadata.num_rows for f in opened]
        numpy_of = {c.get("name"): c.get("numpy_type") for c in meta.get("columns", [])}
        out = {}
        for name in names:
            pieces = [f.read(columns=[name]) for f in opened]
            filled = _plain_numbers(pieces, numpy_of.get(name))
            if filled is not None:
                out[name] = filled
                del pieces
                continue
            piece_meta = {b"pandas": json.dumps({**meta, "columns": [c for c in meta.get("columns", [])
                                                                     if c.get("name") == name]}).encode()}
            joined = pa.concat_tables([t.replace_schema_metadata(piece_meta if meta else None) for t in pieces])
            del pieces
            out[name] = joined.to_pandas(self_destruct=True)[name]
            del joined
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError):
        return None, ""
    finally:
        pa.default_memory_pool().release_unused()
    frame = pd.DataFrame(out, copy=False) if out else pd.DataFrame(index=pd.RangeIndex(sum(rows)))
    order = json.loads((first.metadata or {}).get(COLUMNS_KEY, b"[]")) or [""]
    dtype = order.pop()
    if columns is None or PARTITION in columns:
        at = order.index(PARTITION) if PARTITION in order else 0
        codes = np.repeat(np.array([code_of[part] for part, _ in files], dtype=np.int32), rows)
        frame.insert(min(at, len(frame.columns)), PARTITION, pd.Categorical.from_codes(codes, categories=processes))
    return frame, dtype


def _plain_numbers(pieces, numpy_type: Optional[str]):
    """The one-column tables ``pieces`` as one numpy array (or nullable integer array),
    filled chunk by chunk (no pandas conversion, which on 8 M-row integer columns costs
    twice as much); None unless pandas would give that same dtype (numbers without nulls)."""
    import pyarrow.types as pat

    first = pieces[0].schema.types[0]
    if not (pat.is_integer(first) or pat.is_floating(first)) or \
            any(t.schema.types[0] != first or t.column(0).null_count for t in pieces):
        return None
    plain = str(np.dtype(first.to_pandas_dtype()))
    if numpy_type == "Int64" and plain == "int64":  # nullable, no nulls here
        values = _plain_numbers(pieces, plain)
        return pd.arrays.IntegerArray(values, np.zeros(len(values), dtype=bool))
    if numpy_type != plain:
        return None
    out = np.empty(sum(t.num_rows for t in pieces), dtype=numpy_type)
    at = 0
    for t in pieces:
        for chunk in t.column(0).chunks:
            out[at:at + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
            at += len(chunk)
    return out


def _to_pandas(data, names: List[str], filter=None) -> pd.DataFrame:
    """A file's columns as pandas. Without a filter, a large file a column at a time, each
    Arrow buffer freed as it is converted: the peak is the frame plus one column, not
    the frame twice."""
    import pyarrow as pa

    if filter is not None or data.count_rows() <= SMALL_FILE_ROWS:  # (a scan per column costs more there)
        return data.to_table(columns=names, filter=filter).to_pandas(self_destruct=True, split_blocks=True)
    meta = data.schema.pandas_metadata or {}
    numpy_of = {c.get("name"): c.get("numpy_type") for c in meta.get("columns", [])}
    out = {}
    for name in names:
        table = data.to_table(columns=[name])
        filled = _plain_numbers([table], numpy_of.get(name))
        if filled is not None:
            out[name] = filled
            del table
            continue
        table = table.replace_schema_metadata(
            {b"pandas": json.dumps({**meta, "columns": [c for c in meta.get("columns", [])
                                                         if c.get("name") == name]}).encode()} if meta else None)
        out[name] = table.to_pandas(self_destruct=True)[name]
        del table
    pa.default_memory_pool().release_unused()
    return pd.DataFrame(out, copy=False) if out else pd.DataFrame(index=pd.RangeIndex(data.count_rows()))


def _order_within(frame: pd.DataFrame, order_of) -> np.ndarray:
    """Row order: process blocks as they are, each block in ``order_of``'s order."""
    process = frame[PARTITION].cat.codes.to_numpy()
    bounds = np.flatnonzero(np.append(True, process[1:] != process[:-1]))
    out = []
    for a, b in zip(bounds, np.append(bounds[1:], len(frame))):
        out.append(a + order_of(frame["start_ns"].to_numpy()[a:b], frame["end_ns"].to_numpy()[a:b]))
    return np.concatenate(out) if out else np.empty(0, dtype=np.int64)



def table_folders(root: str) -> List[str]:
    """The dataset's tables: each a folder of its root (the catalog's, and the Python samples')."""
    return sorted(d.name for d in os.scandir(root) if d.is_dir())


def duckdb_views(con, root: str) -> Dict[str, str]:
    """Creates one DuckDB view per table over the dataset (nothing is loaded); returns
    {table: view SQL}."""
    out = {}
    for table in table_folders(root):
        d = os.path.join(root, table)
        if not any(True for _ in os.scandir(d)):
            continue
        glob = os.path.join(d, "*", "*.parquet").replace("'", "''")
        sql = (f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM read_parquet('{glob}', "
               f"hive_partitioning = true, union_by_name = true)")
        con.execute(sql)
        out[table] = sql
    return out



# --- a run read from its dataset ---------------------------------------------------------------
# A run read through its dataset never builds the events table implicitly above this
# many events (analysis reads selections; below it, one read of the table is cheaper).
LARGE_EVENTS = 1_000_000


def overlapping(during):
    """The scan filter for rows overlapping one of the times [(start_ns, end_ns)]."""
    import pyarrow.dataset as ds

    overlap = None
    for t0, t1 in during:
        c = (ds.field("start_ns") < int(t1)) & (ds.field("end_ns") > int(t0))
        overlap = c if overlap is None else (overlap | c)
    return overlap


class Dataset:
    """A run's dataset, read a table (or a selection of events) at a time."""

    def __init__(self, root: str, entries: List[dict], empty_tables: Callable[[], Dict[str, pd.DataFrame]]):
        self.root = root
        self._empty_tables = empty_tables  # {table: no rows}, as the builders make them
        self.entries = entries
        with_events = [e for e in entries if e.get("rows", {}).get("events")]
        self.processes = [os.path.basename(e["folder"]) for e in with_events]
        self.partitions = [e["partition"] for e in with_events]
        self.events = sum(e.get("rows", {}).get("events", 0) for e in entries)
        self.large = self.events > LARGE_EVENTS

    def table(self, name: str, filter=None, columns=None, during=None) -> pd.DataFrame:
        """A table; ``during`` ([(start_ns, end_ns)], with ``filter`` selecting those times):
        files that cover none of those times are not opened."""
        keep = None if during is None else self._files_during(name, during)
        frame = read_table(self.root, name, self.processes, self.partitions, filter, columns, keep)
        return self._empty(name, columns) if frame is None else frame

    def _files_during(self, table: str, during):
        spans = {e["partition"]: e.get("spans", {}).get(table, {}) for e in self.entries}

        def keep(part, path):
            span = spans.get(part, {}).get(os.path.basename(path))
            return span is None or any(span[0] < t1 and span[1] > t0 for t0, t1 in during)

        return keep

    def select(self, categories=None, kinds=None, names=None, processes=None, columns=None,
               during=None) -> pd.DataFrame:
        """Events matching every given list, read with the filter pushed into the scan;
        ``during``: [(start_ns, end_ns)], only events overlapping one of those times."""
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        wanted_lists = (("category", categories), ("kind", kinds), ("name", names), ("process", processes))
        if any(wanted is not None and not len(wanted) for _, wanted in wanted_lists):
            return self._empty("events", columns)
        conditions = [ds.field(column).isin([str(w) for w in wanted]) for column, wanted in wanted_lists[:3]
                      if wanted is not None]
        if during is not None:
            if not len(during):
                return self._empty("events", columns)
            conditions.append(overlapping(during))
        expr = None
        for c in conditions:
            expr = c if expr is None else (expr & c)
        keep = None if processes is None else {str(p) for p in processes}
        # a process whose trace has none of the wanted categories or names is not read at all
        present = {os.path.basename(e["folder"]): e for e in self.entries}
        procs = [(p, part) for p, part in zip(self.processes, self.partitions)
                 if (keep is None or p in keep)
                 and (categories is None or "categories" not in present[p]
                      or set(map(str, categories)) & set(present[p]["categories"]))
                 and (names is None or "names" not in present[p] or set(map(str, names)) & set(present[p]["names"]))]
        if not procs:
            return self._empty("events", columns)
        frame = read_table(self.root, "events", [p for p, _ in procs], [part for _, part in procs],
                           expr if expr is not None else pc.scalar(True), columns,
                           None if during is None else self._files_during("events", during))
        return self._empty("events", columns) if frame is None else frame

    def _empty(self, name: str, columns=None) -> pd.DataFrame:
        frame = self._empty_tables()[name]
        return frame if columns is None else frame[[c for c in columns if c in frame.columns]]

    def py_raw(self):
        """(raw samples, stacks) as ``samples.raw_frames`` gives them for the whole run:
        each process's stacks re-interned onto run-wide ids (same frames, same id)."""

        ids, rows, parts = {}, [], []
        for process, part in zip(self.processes, self.partitions):
            files = dict(files_of(self.root, "pystacks", [part]))
            if part not in files:
                continue
            stacks = pd.read_parquet(files[part])
            raw = read_table(self.root, "pysamples", [process], [part])
            local = np.empty(len(stacks), dtype=np.int64)
            for i, (parent, function, file, line) in enumerate(zip(
                    stacks["parent"].to_numpy(), stacks["function"], stacks["file"], stacks["line"].to_numpy())):
                gparent = int(local[parent]) if parent >= 0 else -1  # parents come first
                key = (gparent, function, file, int(line))
                if key not in ids:
                    ids[key] = len(ids)
                    rows.append(key)
                local[i] = ids[key]
            if raw is not None:
                raw["stack"] = local[raw["stack"].to_numpy()]
                parts.append(raw)
        if not parts:
            return raw_frames([])
        depth = []
        for parent, *_ in rows:
            depth.append(depth[parent] + 1 if parent >= 0 else 0)
        stacks = pd.DataFrame({
            "stack": np.arange(len(rows), dtype=np.int64), "parent": np.array([r[0] for r in rows], dtype=np.int64),
            "depth": np.array(depth, dtype=np.int64), "function": [r[1] for r in rows],
            "file": [r[2] for r in rows], "line": np.array([r[3] for r in rows], dtype=np.int64)},
            columns=STACK_COLUMNS)
        raw = pd.concat(parts, ignore_index=True)
        raw["process"] = raw["process"].astype(str).astype("category")
        if "thread" in raw:  # categorical, as analysis/tables/samples.py builds it in memory
            raw["thread"] = raw["thread"].astype(str).astype("category")
        return raw, stacks

    def names(self) -> list:
        seen = {}
        for e in self.entries:
            for n in e.get("names", []):
                seen.setdefault(n, None)
        return list(seen)

    def extents(self) -> pd.DataFrame:
        rows = {os.path.basename(e["folder"]): e["extent"] for e in self.entries if e.get("extent")}
        frame = pd.DataFrame.from_dict(rows, orient="index",
                                       columns=["start_ns", "end_ns", "events", "recorded"]).astype("int64")
        frame.index.name = PARTITION
        return frame

