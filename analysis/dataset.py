"""The run as a partitioned Parquet dataset: what analysis reads when a run is large.

Layout (docs/format.md, a contract DuckDB, Spark and Trino read as it is)::

    <root>/<table>/process=<process folder>/part-0.parquet

Tables: ``events`` (the decoded trace, times on the wall clock), ``steps``,
``phases``, ``system`` and the GPU tables (``kernels``, ``memcpy``, ``memset``,
``sync``, ``cuda_api``), the same columns as ``stepscope.load(RUN).<table>``
except ``process``, which is the Hive partition key. Events are written in row
groups of ``ROW_GROUP_ROWS`` rows, sorted by start time within each process.

Every table of a process is derived from that process's trace alone (steps
belong to a process's threads, GPU records to the process that saw them), so
the dataset is built one process at a time (in parallel when there are
several): the memory needed is that of the largest process, not of the run.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, Iterable, List, Optional

import numpy as np
import pandas as pd

from stepscope.analysis.store.schema import DATASET_TABLES, GPU_TABLES, STACK_COLUMNS

PARTITION = "process"
COLUMNS_KEY = b"stepscope.columns"
ROW_GROUP = 1 << 20  # rows gathered before a file is written (tables with few rows a part)
# Rows per Parquet row group: a time window's read skips the groups outside it by their
# statistics, so smaller groups read less of a large trace (DuckDB writes 122,880)
ROW_GROUP_ROWS = 1 << 17
# Columns that are categorical in the in-memory tables (kept categorical on read).
_CATEGORICAL_PROCESS = {"events", "steps", "phases"}
PARALLEL_BYTES = 32 << 20  # processes are built in parallel above this much trace data


def partition_dir(root: str, table: str, process: str) -> str:
    return os.path.join(root, table, f"{PARTITION}={process}")


def _safe(process: str) -> str:
    # Process folders are "<host>-<rank or pid>"; anything a path or a Hive key cannot hold is replaced.
    return re.sub(r"[^A-Za-z0-9._+@-]", "_", process)


# --- writing ------------------------------------------------------------------------------
def _write(frame: pd.DataFrame, path: str, row_group: int = ROW_GROUP_ROWS) -> None:
    """One Parquet file, a row group at a time (Arrow holds one group, not a copy of the table)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # where the partition column goes back on read, and its dtype there
    order = json.dumps(list(frame.columns) + [str(frame[PARTITION].dtype) if PARTITION in frame else ""])
    frame = frame.drop(columns=[PARTITION], errors="ignore")
    schema = pa.Schema.from_pandas(frame.iloc[:0], preserve_index=False)
    schema = schema.with_metadata({**(schema.metadata or {}), COLUMNS_KEY: order.encode()})
    tmp = f"{path}.tmp{os.getpid()}"
    with pq.ParquetWriter(tmp, schema, **_encodings(schema)) as writer:
        for at in range(0, max(len(frame), 1), row_group):
            writer.write_table(pa.Table.from_pandas(frame.iloc[at:at + row_group], schema=schema,
                                                    preserve_index=False))
    os.replace(tmp, path)


# Integer columns with a few distinct values (per process, device, stream, launch configuration)
LOW_CARDINALITY = {"pid", "rank", "tid", "thread", "device", "stream", "grid_x", "grid_y", "grid_z", "block_x",
                   "block_y", "block_z", "registers", "static_smem", "dynamic_smem"}


def _encodings(schema) -> dict:
    """Parquet encodings by column: dictionaries for strings and the few-valued integers,
    delta encoding for the other integers (times, ids, durations: nearly sorted or small).
    Arrow's default tries a dictionary on every column, which costs more than half of a
    GPU table's write for numbers that rarely repeat; deltas write faster than plain
    values and make a GPU table's files 4-10 times smaller. Both are standard Parquet
    encodings that DuckDB, Spark and Trino read."""
    import pyarrow as pa

    dictionary, delta = [], {}
    for f in schema:
        if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type) or pa.types.is_large_string(f.type) \
                or f.name in LOW_CARDINALITY:
            dictionary.append(f.name)
        elif pa.types.is_integer(f.type):
            delta[f.name] = "DELTA_BINARY_PACKED"
    return {"use_dictionary": dictionary, "column_encoding": delta} if delta else {"use_dictionary": dictionary}


PART_BYTES = 16 << 20  # a process's trace is decoded this much at a time (about 3 M events)
LIVE_VERSION = 2  # of the parts kept between builds of a trace still being written (2: GPU records decoded again)
# What the derived tables are built from: a small share of a large trace's events.
_DERIVED_FROM = ("step", "phase", "system")


def build_process(folder: str, root: str, live: Optional[str] = None) -> dict:
    """Decodes one process folder and writes its partition of every table; returns
    what the run needs to know of it without reading it again (metadata, counts,
    warnings, extent). A trace over ``PART_BYTES`` is decoded a part at a time: its
    events go to one file per part, and the derived tables are built from the step,
    phase and system events kept from every part.

    ``live``: a folder where the parts of a trace that will not change any more
    (a later chunk follows them) are kept, so that the next build of a trace still
    being written decodes only what was written since (its parts are then fixed
    ``PART_BYTES`` of the file, which stay the same as it grows)."""
    from stepscope.analysis import gpu, gpu_raw, kernel_steps, samples, tables
    from stepscope.analysis.reader import _start_order, events_frame, read_process
    from stepscope.analysis.system import system_frame

    name = os.path.basename(folder)
    entry = {"folder": folder, "partition": _safe(name), "events": 0, "rows": {"events": 0}}
    parts = max(1, -(-_trace_bytes(folder) // PART_BYTES))
    identity = _identity(folder) if live else None
    live = live if identity is not None else None  # (a process folder without a trace)
    still_written = live is not None and not _ended(folder)  # else its parts are not kept
    kept, gpu_parts, py_raw, extent = [], [], None, None
    pending = _Pending(root, entry)  # rows of a few tables, written once there are enough
    for i in range(parts):
        reused = _reused_part(live, i, identity) if live and i < parts - 1 else None
        if reused is not None:
            part, events = reused
            if part.get("gpu"):
                gpu_parts.append(i)
        else:
            # the GPU records come later (below), unless the trace is one part
            p = read_process(folder, i, parts, PART_BYTES if live else 0, gpu=parts == 1)
            if i == parts - 1:  # what every part carries: metadata, structural warnings, counts, names, stacks
                entry.update(meta=p.meta, dropped=p.dropped, clean_close=p.clean_close, readable=p.readable,
                             lost_samples=p.lost_samples)
                py_raw = samples.raw_frames([p])
                if p.columns is not None:
                    entry["names"] = [str(n) for n in p.columns["names"]]
            final = live and still_written and p.columns is not None \
                and int(p.columns.get("valid_end", 0)) >= (i + 1) * PART_BYTES
            where = os.path.join(live, f"part-{i:05d}") if final else None
            # GPU records wait until steps and phases are known: decoded again then (decoding
            # is cheaper than keeping them), unless the trace is one part
            has_gpu = p.columns is not None and p.columns.get("gpu_chunks", 0) > 0
            if has_gpu:  # (before events_frame, which releases the decoded columns)
                gpu_parts.append(gpu_raw.raw_columns(p) if parts == 1 else i)
            # (a damaged chunk is reported by the part that decodes it)
            part = {"events": p.events, "gpu": bool(has_gpu), "warnings": list(p.warnings)}
            events = events_frame([p])
            del p
            if len(events):
                part["work"] = int((~events["category"].isin(["system", "internal"])).sum())
                part["categories"] = list(map(str, events["category"].cat.remove_unused_categories().cat.categories))
                part["extent"] = [int(events["start_ns"].min()), int(events["end_ns"].max()), len(events)]
            if where:
                _keep_part(where, part, events, identity)
        entry["events"] += part["events"]
        _add_warnings(entry, part.get("warnings", []))
        if not len(events):
            continue
        seen = entry.setdefault("categories", [])  # what select() need not look for elsewhere
        seen.extend(c for c in part["categories"] if c not in seen)
        here = (*part["extent"], part["work"])
        extent = here if extent is None else (min(extent[0], here[0]), max(extent[1], here[1]),
                                              extent[2] + here[2], extent[3] + here[3])
        if parts == 1:
            kept.append(events)
        else:
            # the process's last event end closes its last step: keep that event too
            keep = events["category"].isin(_DERIVED_FROM).to_numpy().copy()
            keep[int(events["end_ns"].to_numpy().argmax())] = True
            kept.append(events[keep])
        kept_file = part["events_file"] if reused is not None else None
        if live and kept_file is None and os.path.exists(os.path.join(live, f"part-{i:05d}.json")):
            kept_file = os.path.join(live, f"part-{i:05d}.events.parquet")  # kept just now
        if kept_file is not None:
            d = _made(partition_dir(root, "events", entry["partition"]))
            _link(kept_file, os.path.join(d, f"part-{i}.parquet"))
            _span(entry, "events", f"part-{i}.parquet", *part["extent"][:2])
        else:  # parts with few events (a GPU trace's) are gathered into files of 1 M rows
            pending.add("events", i, events)
            pending.flush(ROW_GROUP)
        entry["rows"]["events"] += int(part["extent"][2])
        del events
    pending.flush(0)
    if extent is not None:
        entry["extent"] = dict(zip(("start_ns", "end_ns", "events", "recorded"), extent))
    if len(kept) > 1:
        kept = _concat(kept)  # (parts kept from earlier builds may know fewer names)
        kept = kept.iloc[_start_order(kept["start_ns"].to_numpy(), kept["end_ns"].to_numpy())] \
            .reset_index(drop=True)
    else:
        kept = kept[0] if kept else _empty_tables()["events"]
    steps, phases = tables.steps_and_phases(kept)
    out = {"steps": steps, "phases": phases, "system": system_frame(kept)}
    del kept
    # GPU records a part at a time (a GPU trace is mostly kernels): each part's tables are
    # one file, and the kernels are aggregated per step as they go
    timeline, aggregates = gpu.Timeline(steps, phases), []

    def raw_of(k):  # the GPU columns of the k-th entry of gpu_parts (decoded again), None past the end
        if k >= len(gpu_parts):
            return None
        if not isinstance(gpu_parts[k], int):
            return gpu_parts[k]
        p = read_process(folder, gpu_parts[k], parts, PART_BYTES if live else 0, events=False)
        _add_warnings(entry, p.warnings)
        return gpu_raw.raw_columns(p)

    earlier, raw = None, raw_of(0)
    for k in range(len(gpu_parts)):
        at = gpu_parts[k] if isinstance(gpu_parts[k], int) else 0
        after = raw_of(k + 1)  # a launch may be recorded a part before or after its kernel
        gpu_parts[k] = None
        if raw is None:  # (its GPU chunks were all damaged)
            earlier, raw = None, after
            continue
        nearby = [keys for keys in (earlier, None if after is None else gpu_raw.api_keys(after)) if keys is not None]
        part = gpu.gpu_tables(raw, steps, phases, timeline=timeline, other_api=nearby)
        earlier, raw = gpu_raw.api_keys(raw), after  # of the part before, only its launches are needed
        del after, nearby
        aggregates.append(kernel_steps.aggregate(part["kernels"]))
        for table, frame in part.items():
            entry["rows"][table] = entry["rows"].get(table, 0) + int(len(frame))
            if len(frame) and table in _FEW_ROWS:
                pending.add(table, at, frame)
            elif len(frame):
                d = _made(partition_dir(root, table, entry["partition"]))
                _write(frame, os.path.join(d, f"part-{at:05d}.parquet"))
                _span(entry, table, f"part-{at:05d}.parquet", frame["start_ns"].min(), frame["end_ns"].max())
        pending.flush(ROW_GROUP)
        del part
        _release_arrow_memory()
    pending.flush(0)
    del earlier, raw
    out.update(kernel_steps.combine(aggregates))
    out["pysamples"], out["pystacks"] = py_raw if py_raw is not None else samples.raw_frames([])
    del py_raw
    for table in DATASET_TABLES[1:]:
        if table in GPU_TABLES:
            entry["rows"].setdefault(table, 0)
            continue
        frame = out.pop(table)
        if len(frame):  # a table this process has no rows of has no partition
            d = partition_dir(root, table, entry["partition"])
            os.makedirs(d, exist_ok=True)
            _write(frame, os.path.join(d, "part-0.parquet"))
        entry["rows"][table] = int(len(frame))
        del frame
    return entry


_FEW_ROWS = ("memcpy", "memset", "sync")  # GPU tables with a few rows a step: written a file per 1 M rows


def _add_warnings(entry: dict, warnings) -> None:
    """A process's warnings, each once (every part repeats those about the file's structure)."""
    seen = entry.setdefault("warnings", [])
    seen.extend(w for w in warnings if w not in seen)


def _span(entry: dict, table: str, file: str, start, end) -> None:
    """Notes the time a file of a table covers: reads of a time window skip the files
    outside it without opening them (a large GPU trace is hundreds of files a process)."""
    entry.setdefault("spans", {}).setdefault(table, {})[file] = [int(start), int(end)]


def _made(d: str) -> str:
    os.makedirs(d, exist_ok=True)
    return d


class _Pending:
    """Rows of a table gathered over parts and written once there are ``ROW_GROUP`` of
    them (the small GPU tables; the events of a GPU trace, a few thousand a part): a
    file per part would be hundreds of tiny files per process, and reads open each."""

    def __init__(self, root: str, entry: dict):
        self.root, self.entry = root, entry
        self.frames = {}  # table -> (first part number, [frames])

    def add(self, table: str, at: int, frame: pd.DataFrame) -> None:
        self.frames.setdefault(table, (at, []))[1].append(frame)

    def flush(self, at_least: int) -> None:
        for table, (first, frames) in list(self.frames.items()):
            if sum(len(f) for f in frames) >= max(at_least, 1):
                d = _made(partition_dir(self.root, table, self.entry["partition"]))
                frame = _concat(frames) if len(frames) > 1 else frames[0]
                name = f"part-{first}.parquet" if table == "events" else f"part-{first:05d}.parquet"
                _write(frame, os.path.join(d, name))
                _span(self.entry, table, name, frame["start_ns"].min(), frame["end_ns"].max())
                del self.frames[table]


def _release_arrow_memory() -> None:
    """Arrow's allocator keeps freed memory for reuse; between parts it is given back, so a
    worker's peak is one part's, not the largest it ever held plus the allocator's cache."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


# --- a trace still being written: its finished parts, kept between builds ------------------
def _identity(folder: str) -> Optional[list]:
    from stepscope.core.vocabulary import TRACE_FILE

    try:
        st = os.stat(os.path.join(folder, TRACE_FILE))
    except OSError:
        return None
    return [st.st_dev, st.st_ino, PART_BYTES]


def _ended(folder: str) -> bool:
    """The process stopped profiling (process.json has its end time): its trace is final."""
    from stepscope.core.vocabulary import PROCESS_JSON

    try:
        with open(os.path.join(folder, PROCESS_JSON)) as f:
            return json.load(f).get("end_time") is not None
    except (OSError, ValueError, AttributeError):
        return False


def _keep_part(where: str, part: dict, events: pd.DataFrame, identity: list) -> None:
    """Keeps a finished part: its events file and the events the derived tables need (its
    GPU records are decoded again: cheaper than keeping them); the JSON, written last,
    makes it usable."""
    keep = events["category"].isin(_DERIVED_FROM).to_numpy().copy()
    if len(events):
        keep[int(events["end_ns"].to_numpy().argmax())] = True
    _write(events, f"{where}.events.parquet")
    tmp = f"{where}.kept.parquet.tmp{os.getpid()}"  # (another load of the run may be reading it)
    events[keep].to_parquet(tmp, index=False)  # every column, as decoded
    os.replace(tmp, f"{where}.kept.parquet")
    info = dict(part, identity=identity, version=LIVE_VERSION, events_file=f"{where}.events.parquet")
    with open(f"{where}.json.tmp{os.getpid()}", "w") as f:
        json.dump(info, f)
    os.replace(f"{where}.json.tmp{os.getpid()}", f"{where}.json")


def _reused_part(live: str, i: int, identity: list):
    """(part info, events) of a part kept by an earlier build of the same trace, or None.
    The events are those kept for the derived tables (the full part is linked)."""
    where = os.path.join(live, f"part-{i:05d}")
    try:
        with open(f"{where}.json") as f:
            part = json.load(f)
        if part.get("identity") != identity or part.get("version") != LIVE_VERSION:
            return None
        return part, pd.read_parquet(f"{where}.kept.parquet")
    except (OSError, ValueError):
        return None


def _link(src: str, dest: str) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def build(folders: List[str], root: str, progress: Optional[bool] = None, live: Optional[str] = None) -> List[dict]:
    """Writes the dataset of these process folders under ``root`` (replacing what was
    there); returns one entry per process, in folder order. ``live``: where the
    finished parts of traces are kept for the next build (``build_process``)."""
    if os.path.isdir(root):
        shutil.rmtree(root)
    os.makedirs(root)
    sizes = [_trace_bytes(f) for f in folders]
    parallel = len(folders) > 1 and sum(sizes) >= PARALLEL_BYTES and (os.cpu_count() or 1) > 1
    lives = [None] * len(folders)
    if live is not None:
        lives = [os.path.join(live, _safe(os.path.basename(f))) for f in folders]
        for d in lives:
            os.makedirs(d, exist_ok=True)
    bar = _progress(sum(sizes), progress)
    try:
        return _build(folders, sizes, root, parallel, bar, lives)
    finally:
        bar.close()


def _build(folders, sizes, root, parallel, bar, lives) -> List[dict]:
    if not parallel:
        entries = []
        for folder, size, live in zip(folders, sizes, lives):
            entries.append(build_process(folder, root, live))
            bar.update(size)
        return entries
    import multiprocessing

    # spawn: a fork of the caller (maybe a notebook with threads running) could deadlock
    workers = min(len(folders), os.cpu_count() or 1, 8)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(build_process, f, root, live) for f, live in zip(folders, lives)]
        entries = []
        for future, size in zip(futures, sizes):
            entries.append(future.result())
            bar.update(size)
        return entries


def _trace_bytes(folder: str) -> int:
    from stepscope.core.vocabulary import TRACE_FILE

    try:
        return os.path.getsize(os.path.join(folder, TRACE_FILE))
    except OSError:
        return 0


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total: int, progress: Optional[bool]):
    from stepscope.analysis.reader import PROGRESS_BYTES

    if progress is None:
        progress = total >= PROGRESS_BYTES and sys.stderr.isatty()
    if not progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="stepscope: building the run's dataset", leave=False)


# --- reading --------------------------------------------------------------------------------
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
    frame = parts[0] if len(parts) == 1 else _concat(parts)
    if table == "events" and len(files) > len({part for part, _ in files}) \
            and {PARTITION, "start_ns", "end_ns"} <= set(frame.columns):
        # a process decoded in parts: its events in start order again, as when decoded at once
        from stepscope.analysis.reader import _start_order

        frame = frame.iloc[_order_within(frame, _start_order)].reset_index(drop=True)
    if PARTITION not in frame.columns:
        pass
    elif table in _CATEGORICAL_PROCESS or dtype == "category":
        frame[PARTITION] = frame[PARTITION].cat.remove_unused_categories()
    elif dtype:  # the dtype the in-memory table has (object or str)
        frame[PARTITION] = frame[PARTITION].astype(dtype)
    return frame


SMALL_FILE_ROWS = 1 << 16


def _to_pandas(data, names: List[str], filter=None) -> pd.DataFrame:
    """A file's columns as pandas. Without a filter, a large file a column at a time, each
    Arrow buffer freed as it is converted: the peak is the frame plus one column, not
    the frame twice."""
    import pyarrow as pa

    if filter is not None or data.count_rows() <= SMALL_FILE_ROWS:  # (a scan per column costs more there)
        return data.to_table(columns=names, filter=filter).to_pandas(self_destruct=True, split_blocks=True)
    meta = data.schema.pandas_metadata or {}
    out = {}
    for name in names:
        table = data.to_table(columns=[name]).replace_schema_metadata(
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


def _concat(parts: List[pd.DataFrame]) -> pd.DataFrame:
    """Concatenates, keeping categorical columns categorical (categories in order of
    appearance, process by process, as the in-memory tables have them)."""
    from pandas.api.types import union_categoricals

    cats = {c for part in parts for c in part.columns if isinstance(part[c].dtype, pd.CategoricalDtype)}
    frame = pd.concat(parts, ignore_index=True)
    for c in cats:
        if not isinstance(frame[c].dtype, pd.CategoricalDtype):
            frame[c] = union_categoricals([pd.Categorical(part[c]) for part in parts], ignore_order=True)
    return frame


def duckdb_views(con, root: str) -> Dict[str, str]:
    """Creates one DuckDB view per table over the dataset (nothing is loaded); returns
    {table: view SQL}."""
    out = {}
    for table in DATASET_TABLES:
        d = os.path.join(root, table)
        if not os.path.isdir(d) or not any(True for _ in os.scandir(d)):
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


@functools.lru_cache(maxsize=None)
def _empty_tables() -> Dict[str, pd.DataFrame]:
    """Each table with no rows, as the in-memory builders make it (same columns and dtypes)."""
    from stepscope.analysis import gpu, kernel_steps, tables
    from stepscope.analysis.reader import _empty_events
    from stepscope.analysis.system import system_frame

    events = _empty_events()
    steps, phases = tables.steps_and_phases(events)
    out = {"events": events, "steps": steps, "phases": phases, "system": system_frame(events)}
    out.update(gpu.gpu_tables(gpu.empty_raw(), steps, phases))
    out.update(kernel_steps.aggregate(out["kernels"]))
    return out


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

    def __init__(self, root: str, entries: List[dict]):
        self.root = root
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

    @staticmethod
    def _empty(name: str, columns=None) -> pd.DataFrame:
        frame = _empty_tables()[name]
        return frame if columns is None else frame[[c for c in columns if c in frame.columns]]

    def py_raw(self):
        """(raw samples, stacks) as ``samples.raw_frames`` gives them for the whole run:
        each process's stacks re-interned onto run-wide ids (same frames, same id)."""
        from stepscope.analysis import samples

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
            return samples.raw_frames([])
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
        if "thread" in raw:  # categorical, as analysis/samples.py builds it in memory
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
