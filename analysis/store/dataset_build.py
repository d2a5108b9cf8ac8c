"""The run as a partitioned Parquet dataset, built: what analysis reads when a run is large.

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

import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import List, Optional

import pandas as pd

from stepscope.analysis.store import gpu_raw, reader
from stepscope.analysis.store.reader import PROGRESS_BYTES, empty_events, events_frame, start_order
from stepscope.analysis.store import py_samples
from stepscope.analysis.store.dataset_files import link_or_copy, partition_dir, safe_partition, write_file
from stepscope.analysis.store.dataset_live import derived_rows, ended, keep_part, reused_part, trace_identity
from stepscope.analysis.store.dataset_read import read_table
from stepscope.analysis.store.frames import columns_of, concat, concat_in_order
from stepscope.analysis.store.recipe import SOURCES, Catalog, built, checked
from stepscope.analysis.store.schema import DATASET_SAMPLES
from stepscope.core.vocabulary import TRACE_FILE

PART_BYTES = 16 << 20  # a process's trace is decoded this much at a time (about 3 M events)
ROW_GROUP = 1 << 20  # rows gathered before a file is written (tables with few rows a part)
PARALLEL_BYTES = 32 << 20  # processes are built in parallel above this much trace data


def build_process(folder: str, root: str, catalog: Catalog, live: Optional[str] = None) -> dict:
    """Decodes one process folder and writes its partition of every table; returns
    what the run needs to know of it without reading it again (metadata, counts,
    warnings, extent). Its tables are built from ``catalog``'s recipes. A trace over
    ``PART_BYTES`` is decoded a part at a time: its events go to one file per part, and
    the derived tables are built from the events their recipes read, kept from every part.

    ``live``: a folder where the parts of a trace that will not change any more
    (a later chunk follows them) are kept, so that the next build of a trace still
    being written decodes only what was written since (its parts are then fixed
    ``PART_BYTES`` of the file, which stay the same as it grows)."""
    name = os.path.basename(folder)
    entry = {"folder": folder, "partition": safe_partition(name), "events": 0, "rows": {"events": 0}}
    parts = max(1, -(-_trace_bytes(folder) // PART_BYTES))
    rows = catalog.event_rows()  # (what the derived tables read of a trace in parts)
    identity = trace_identity(folder, PART_BYTES) if live else None
    if identity is not None:  # kept parts are of one part size and one catalog's rows
        identity.append([list(r) for r in rows])
    live = live if identity is not None else None  # (a process folder without a trace)
    still_written = live is not None and not ended(folder)  # else its parts are not kept
    kept, gpu_parts, py_raw, extent = [], [], None, None
    pending = _Pending(root, entry)  # rows of a few tables, written once there are enough
    for i in range(parts):
        reused = reused_part(live, i, identity) if live and i < parts - 1 else None
        if reused is not None:
            part, events = reused
            if part.get("gpu"):
                gpu_parts.append(i)
        else:
            # the GPU records come later (below), unless the trace is one part
            p = reader.read_process(folder, i, parts, PART_BYTES if live else 0, gpu=parts == 1)
            if i == parts - 1:  # what every part carries: metadata, structural warnings, counts, names, stacks
                entry.update(meta=p.meta, dropped=p.dropped, clean_close=p.clean_close, readable=p.readable,
                             lost_samples=p.lost_samples)
                py_raw = py_samples.raw_frames([p])
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
                keep_part(where, part, events, identity, rows)
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
            # (columns apart: concat_in_order frees each as it goes)
            kept.append(columns_of(events, derived_rows(events, *rows)))
        kept_file = part["events_file"] if reused is not None else None
        if live and kept_file is None and os.path.exists(os.path.join(live, f"part-{i:05d}.json")):
            kept_file = os.path.join(live, f"part-{i:05d}.events.parquet")  # kept just now
        if kept_file is not None:
            d = _made(partition_dir(root, "events", entry["partition"]))
            link_or_copy(kept_file, os.path.join(d, f"part-{i}.parquet"))
            _span(entry, "events", f"part-{i}.parquet", *part["extent"][:2])
        else:  # parts with few events (a GPU trace's) are gathered into files of 1 M rows
            pending.add("events", i, events)
            pending.flush(ROW_GROUP)
        entry["rows"]["events"] += int(part["extent"][2])
        del events
        _release_arrow_memory()  # (what writing the part took, before the next part is decoded)
    pending.flush(0)
    if extent is not None:
        entry["extent"] = dict(zip(("start_ns", "end_ns", "events", "recorded"), extent))
    if len(kept) > 1:
        kept = concat_in_order(kept, start_order)  # (parts kept from earlier builds may know fewer names)
    else:
        kept = pd.DataFrame(kept[0], copy=False) if kept else empty_events()
    _release_arrow_memory()
    before, per_part, after = catalog.dataset_stages()
    out = _build_before(before, after, kept)
    del kept
    _build_parts(catalog, per_part, out, gpu_parts, entry, pending, folder, parts, live)
    for recipe in after:  # (over part-wise tables: read back from this process's files)
        inputs = {i: out[i] if i in out else _read_back(root, entry, catalog, i) for i in recipe.inputs}
        out.update(built(recipe, inputs))
    out["pysamples"], out["pystacks"] = py_raw if py_raw is not None else py_samples.raw_frames([])
    del py_raw
    for table in (*catalog.names[1:], *DATASET_SAMPLES):
        if table in catalog.part_tables():
            entry["rows"].setdefault(table, 0)
            continue
        frame = out.pop(table)
        if len(frame):  # a table this process has no rows of has no partition
            d = partition_dir(root, table, entry["partition"])
            os.makedirs(d, exist_ok=True)
            write_file(frame, os.path.join(d, "part-0.parquet"))
        entry["rows"][table] = int(len(frame))
        del frame
    return entry


def _build_before(before, after, events) -> dict:
    """The tables of the recipes that read no part-wise table, in catalog order; the last
    to read the events takes them (``consume``) when nothing after it reads them."""
    readers = [r for r in (*before, *after) if "events" in r.inputs]
    last = readers[-1] if readers else None
    consumer = last if last is not None and last.consumes and any(r is last for r in before) else None
    out = {"events": events}
    for recipe in before:
        inputs = {i: out[i] for i in recipe.inputs}
        if recipe is consumer:
            del out["events"]
            out.update(built(recipe, inputs, consume=True))
        else:
            out.update(built(recipe, inputs))
        del inputs
    out.pop("events", None)
    return out


def _build_parts(catalog, per_part, out, gpu_parts, entry, pending, folder, parts, live) -> None:
    """The part-wise recipes, a part of the GPU records at a time: each part's tables are
    written as they come (one file a part, or gathered for ``few_rows`` tables), and the
    recipes over them are built per part and combined (the kernels aggregated per step as
    they go)."""
    root = pending.root
    by_part = [r for r in per_part if r.by_part]
    shared = {id(r): r.prepare(**{i: out[i] for i in r.inputs if i not in SOURCES})
              for r in by_part if r.prepare is not None and gpu_parts}
    results = {id(r): [] for r in per_part if not r.by_part}
    few = {t.name for r in by_part for t in r.tables if t.few_rows}

    def raw_of(k):  # the GPU columns of the k-th entry of gpu_parts (decoded again), None past the end
        if k >= len(gpu_parts):
            return None
        if not isinstance(gpu_parts[k], int):
            return gpu_parts[k]
        p = reader.read_process(folder, gpu_parts[k], parts, PART_BYTES if live else 0, events=False)
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
        here = {}
        for r in by_part:
            here.update(built(r, {i: raw if i == "gpu_raw" else out[i] for i in r.inputs},
                              shared=shared.get(id(r)), nearby=nearby))
        earlier, raw = gpu_raw.api_keys(raw), after  # of the part before, only its launches are needed
        del after, nearby
        written = set(here)
        for r in per_part:
            if not r.by_part:
                result = built(r, {i: here[i] if i in here else out[i] for i in r.inputs})
                results[id(r)].append(result)
                here.update(result)
        for table in written:
            frame = here[table]
            entry["rows"][table] = entry["rows"].get(table, 0) + int(len(frame))
            if len(frame) and table in few:
                pending.add(table, at, frame)
            elif len(frame):
                d = _made(partition_dir(root, table, entry["partition"]))
                write_file(frame, os.path.join(d, f"part-{at:05d}.parquet"))
                if "start_ns" in frame and "end_ns" in frame:  # (a plugin's table may have no times)
                    _span(entry, table, f"part-{at:05d}.parquet", frame["start_ns"].min(), frame["end_ns"].max())
        pending.flush(ROW_GROUP)
        del here
        _release_arrow_memory()
    pending.flush(0)
    for r in per_part:
        if not r.by_part:
            out.update(checked(r, r.combine(results.pop(id(r)))))


def _read_back(root: str, entry: dict, catalog, table: str) -> pd.DataFrame:
    """A part-wise table of this process, whole, from the files just written."""
    frame = read_table(root, table, [os.path.basename(entry["folder"])], [entry["partition"]])
    return catalog.empty[table] if frame is None else frame


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
                frame = concat(frames) if len(frames) > 1 else frames[0]
                name = f"part-{first}.parquet" if table == "events" else f"part-{first:05d}.parquet"
                write_file(frame, os.path.join(d, name))
                if "start_ns" in frame and "end_ns" in frame:
                    _span(self.entry, table, name, frame["start_ns"].min(), frame["end_ns"].max())
                del self.frames[table]


def _release_arrow_memory() -> None:
    """Arrow's allocator keeps freed memory for reuse; between parts it is given back, so a
    worker's peak is one part's, not the largest it ever held plus the allocator's cache."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def build(folders: List[str], root: str, catalog: Catalog, progress: Optional[bool] = None,
          live: Optional[str] = None) -> List[dict]:
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
        lives = [os.path.join(live, safe_partition(os.path.basename(f))) for f in folders]
        for d in lives:
            os.makedirs(d, exist_ok=True)
    bar = _progress(sum(sizes), progress)
    try:
        return _build(folders, sizes, root, catalog, parallel, bar, lives)
    finally:
        bar.close()


def _build(folders, sizes, root, catalog, parallel, bar, lives) -> List[dict]:
    if not parallel:
        entries = []
        for folder, size, live in zip(folders, sizes, lives):
            entries.append(build_process(folder, root, catalog, live))
            bar.update(size)
        return entries
    import multiprocessing

    # spawn: a fork of the caller (maybe a notebook with threads running) could deadlock
    workers = min(len(folders), os.cpu_count() or 1, 8)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(build_process, f, root, catalog, live) for f, live in zip(folders, lives)]
        entries = []
        for future, size in zip(futures, sizes):
            entries.append(future.result())
            bar.update(size)
        return entries


def _trace_bytes(folder: str) -> int:
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
    if progress is None:
        progress = total >= PROGRESS_BYTES and sys.stderr.isatty()
    if not progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="stepscope: building the run's dataset", leave=False)
