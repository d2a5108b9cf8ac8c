"""The in-memory store: a run's traces decoded at once, its tables built from the events.

A finished run's decoded events (and GPU records, Python samples) are cached once as
Parquet beside the run (``<run>/.stepscope-cache/``), keyed on the size and
modification time of every trace file, so a second load skips decoding.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pandas as pd

from stepscope.analysis.store import gpu_raw
from stepscope.analysis.store.reader import ProcessTrace, events_frame, read_processes
from stepscope.analysis.store import py_samples
from stepscope.analysis.store.recipe import Catalog, built
from stepscope.analysis.store.schema import CACHE_VERSION
from stepscope.core import files, metadata, runinfo
from stepscope.core.vocabulary import CACHE_DIR

PY_CACHE = ("pysamples.parquet", "pystacks.parquet")
# What the in-memory cache's manifest keeps per process (the dataset's manifest keeps more)
CACHE_ENTRY_FIELDS = {k: metadata.MANIFEST_ENTRY_FIELDS[k] for k in ("folder", "meta", "warnings", "events", "dropped")}


def select_rows(ev: pd.DataFrame, categories=None, kinds=None, names=None, processes=None, columns=None,
                during=None) -> pd.DataFrame:
    """The rows of an events table matching every given list and overlapping one of the
    times in ``during`` (see ``Run.select``)."""
    mask = np.ones(len(ev), dtype=bool)
    for column, wanted in (("category", categories), ("kind", kinds), ("name", names), ("process", processes)):
        if wanted is not None:
            mask &= ev[column].isin(list(wanted)).to_numpy()
    if during is not None:
        mask &= overlapping_rows(ev, during)
    out = ev[mask] if not mask.all() else ev
    return out if columns is None else out[[c for c in columns if c in out.columns]]


def overlapping_rows(frame: pd.DataFrame, during) -> np.ndarray:
    """Which rows overlap one of the times [(start_ns, end_ns)]."""
    start, end = frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy()
    near = np.zeros(len(frame), dtype=bool)
    for t0, t1 in during:
        near |= (start < t1) & (end > t0)
    return near


def events_extents(ev: pd.DataFrame) -> pd.DataFrame:
    """Per process: first start, last end, events, and those of the job's own work."""
    if not len(ev):
        return pd.DataFrame(columns=["start_ns", "end_ns", "events", "recorded"])
    work = ~ev["category"].isin(["system", "internal"])
    return pd.DataFrame({"start_ns": ev.groupby("process", observed=True, sort=False)["start_ns"].min(),
                         "end_ns": ev.groupby("process", observed=True, sort=False)["end_ns"].max(),
                         "events": ev.groupby("process", observed=True, sort=False).size(),
                         "recorded": work.groupby(ev["process"], observed=True, sort=False).sum()})


class MemoryStore:
    """Every table built in memory from the decoded events (or the Parquet cache of them)."""

    root = None  # no dataset on disk

    def __init__(self, path: str, manifest: dict, cache: bool, catalog: Catalog):
        self.path, self._manifest, self._cache_ok, self.catalog = path, manifest, cache, catalog
        self.from_cache = False
        self.procs = self._cached_processes() or read_processes(path)
        self._tables: dict = {}
        self._gpu_raw = self._py_raw = None

    @property
    def large(self) -> bool:
        return False

    def has(self, name: str) -> bool:
        return name in self._tables

    def table(self, name: str) -> pd.DataFrame:
        """The events, or a table of the catalog, built with its recipe on first use."""
        if name not in self._tables:
            if name == "events":
                self._tables["events"] = self._cached_events()
            else:
                recipe = self.catalog.recipe_of(name)
                self._tables.update(built(recipe, {i: self._input(i) for i in recipe.inputs}))
        return self._tables[name]

    def _input(self, name: str):
        if name == "gpu_raw":
            self.table("events")  # decodes the traces (or reads the cache), GPU records included
            return self._gpu_raw
        return self.table(name)

    def select(self, categories=None, kinds=None, names=None, processes=None, columns=None,
               during=None) -> pd.DataFrame:
        return select_rows(self.table("events"), categories, kinds, names, processes, columns, during)

    def gpu_select(self, table: str, during=None, columns=None) -> pd.DataFrame:
        return window_rows(self.table(table), during, columns)

    def select_phases(self, names=None, modes=None, steps=None, columns=None) -> pd.DataFrame:
        return phase_rows(self.table("phases"), names, modes, steps, columns)

    def event_names(self) -> list:
        return [str(n) for n in self.table("events")["name"].cat.categories]

    def ranks_with_events(self) -> int:
        ev = self.table("events")
        return int(max(1, ev["rank"].nunique())) if len(ev) else 1

    def extents(self) -> pd.DataFrame:
        return events_extents(self.table("events"))

    def rows(self, name: str) -> int:
        return len(self.table(name))  # known only once built

    def py_raw(self):
        """(raw samples, stacks) of the whole run (``py_samples.raw_frames``)."""
        self.table("events")  # decodes the traces (or reads the cache), samples included
        if self._py_raw is None:
            return py_samples.raw_frames(read_processes(self.path))
        return self._py_raw

    def sql_views(self, con) -> set:
        return set()  # every table is registered from pandas

    def link_tables(self, out_dir: str) -> set:
        return set()

    # --- the Parquet cache ---------------------------------------------------------------
    def _cache_paths(self):
        cache_dir = os.path.join(self.path, CACHE_DIR)
        return cache_dir, os.path.join(cache_dir, "events.parquet"), os.path.join(cache_dir, "manifest.json")

    def _gpu_cache_path(self) -> str:
        return os.path.join(self.path, CACHE_DIR, "gpu.parquet")

    def _cached_processes(self):
        """With a valid cache, the processes' metadata and counts without decoding any trace."""
        if not self._cache_ok:
            return None
        _, cached, manifest_path = self._cache_paths()
        try:
            with open(manifest_path) as f:
                saved = json.load(f)
        except (OSError, ValueError, RecursionError):
            return None
        entries = metadata.manifest_entries(saved, CACHE_ENTRY_FIELDS)  # None: a bad manifest, decode again
        if entries is None or saved.get("version") != CACHE_VERSION or saved.get("traces") != self._manifest["traces"] \
                or not os.path.exists(cached):
            return None
        procs = []
        for entry in entries:
            p = ProcessTrace(entry["folder"], entry["meta"], None, entry["warnings"])
            p.readable, p.events, p.dropped, p.clean_close = True, entry["events"], entry["dropped"], True
            p.lost_samples = entry.get("lost_samples", 0)
            procs.append(p)
        if not procs:
            return None
        self.from_cache = True
        return procs

    def _cached_events(self) -> pd.DataFrame:
        cache_dir, cached, _ = self._cache_paths()
        if self.from_cache:
            try:
                events = read_parquet(cached)
                self._gpu_raw = read_parquet(self._gpu_cache_path())
                self._py_raw = tuple(read_parquet(os.path.join(cache_dir, f)) for f in PY_CACHE)
                return events
            except Exception:  # noqa: BLE001 - a damaged cache: decode the traces instead
                self.procs = read_processes(self.path)
        complete = all(p.readable and p.clean_close for p in self.procs)
        self._gpu_raw = gpu_raw.raw_frame(self.procs)  # first: events_frame releases the decoded columns
        self._py_raw = py_samples.raw_frames(self.procs)
        events = events_frame(self.procs)
        for p in self.procs:  # the events table holds everything now
            p.release()
        if self._cache_ok and complete and len(events):
            manifest = dict(self._manifest, processes=[
                {"folder": p.folder, "meta": p.meta, "warnings": p.warnings, "events": p.events,
                 "dropped": p.dropped, "lost_samples": p.lost_samples} for p in self.procs])
            # Written beside the caller's work; the interpreter waits for it at exit.
            threading.Thread(target=_write_cache, args=(events, self._gpu_raw, cache_dir, cached, manifest,
                                                        self._py_raw),
                             name="stepscope-parquet-cache").start()
        return events


def _write_cache(events, gpu_raw, cache_dir, cached, manifest, py_raw=()) -> None:
    try:
        files.make_dirs(cache_dir)
        py = [(frame, os.path.join(cache_dir, f)) for frame, f in zip(py_raw, PY_CACHE)]
        for frame, path in (*py, (gpu_raw, os.path.join(cache_dir, "gpu.parquet")), (events, cached)):
            tmp = f"{path}.tmp{os.getpid()}"
            write_parquet(frame, tmp)
            os.replace(tmp, path)
        runinfo.write_json_atomic(os.path.join(cache_dir, "manifest.json"), manifest)
        files.narrow_tree(cache_dir)  # pyarrow's files: the umask's mode
    except Exception:  # noqa: BLE001 - a read-only run folder just means no cache
        pass


def read_parquet(path: str) -> pd.DataFrame:
    """Parquet to pandas a column at a time, so the peak is the table plus one column
    rather than two copies of the table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    frame = pd.DataFrame({name: pq.read_table(path, columns=[name]).to_pandas(self_destruct=True)[name]
                          for name in names}, copy=False)
    pa.default_memory_pool().release_unused()  # give Arrow's freed buffers back
    return frame


def write_parquet(frame: pd.DataFrame, path: str, rows_per_group: int = 1 << 20) -> None:
    """Parquet in row groups converted one at a time: Arrow holds one group, not a
    second copy of the table (the cache is written while the caller builds tables)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.Schema.from_pandas(frame.iloc[:0], preserve_index=False)
    with pq.ParquetWriter(path, schema) as writer:
        for at in range(0, max(len(frame), 1), rows_per_group):
            part = pa.Table.from_pandas(frame.iloc[at:at + rows_per_group], schema=schema, preserve_index=False)
            writer.write_table(part)


def window_rows(frame: pd.DataFrame, during=None, columns=None) -> pd.DataFrame:
    """``frame``'s rows overlapping one of the times in ``during`` (None: all), ``columns`` only."""
    if during is not None:
        frame = frame[overlapping_rows(frame, during)]
    return frame if columns is None else frame[[c for c in columns if c in frame.columns]]


def phase_rows(phases: pd.DataFrame, names=None, modes=None, steps=None, columns=None) -> pd.DataFrame:
    """The phases of these names, modes and step numbers (each a list, None: all)."""
    keep = np.ones(len(phases), dtype=bool)
    for column, wanted in (("name", names), ("mode", modes), ("step", steps)):
        if wanted is not None:
            keep &= phases[column].isin(list(wanted)).to_numpy()
    out = phases if keep.all() else phases[keep]
    return out if columns is None else out[[c for c in columns if c in out.columns]]
