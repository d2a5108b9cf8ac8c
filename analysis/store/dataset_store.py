"""The dataset store: a run read through its partitioned Parquet dataset.

Opened when a dataset of the traces' current state is cached beside the run, or
built when the run is too large to decode at once (``dataset=True``: always). Each
table is read when first asked for; a large run's events never are as a whole:
analysis reads selections of them, with the filter pushed into the scan.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import weakref
from typing import Optional

import pandas as pd

from stepscope.analysis.store.reader import ProcessTrace, process_folders
from stepscope.analysis.store import dataset_build
from stepscope.analysis.store.dataset_read import Dataset, duckdb_views, overlapping, table_folders
# (a dataset small enough to hold its events is read as memory is)
from stepscope.analysis.store.memory import phase_rows, select_rows, window_rows
from stepscope.analysis.store.recipe import Catalog
from stepscope.analysis.store.schema import CACHE_VERSION
from stepscope.core import files, metadata, runinfo
from stepscope.core.vocabulary import CACHE_DIR

LIVE_DIR = "live"  # under the run's cache folder: finished parts of traces still being written
# Traces larger than this (about 8 M events) are read through the run's Parquet dataset, a process
# and a part at a time: the first load decodes into it, later ones only read it
LARGE_BYTES = 64 << 20


class DatasetStore:
    """Every table read from the run's dataset (``dataset_read.Dataset``)."""

    def __init__(self, root: str, entries: list, catalog: Catalog, private: bool = False):
        self.data = Dataset(root, entries, lambda: catalog.empty)
        self.root = root
        self.from_cache = False
        self.procs = []
        for e in entries:
            p = ProcessTrace(e["folder"], e["meta"], None, e["warnings"])
            p.readable, p.events, p.dropped, p.clean_close = e["readable"], e["events"], e["dropped"], e["clean_close"]
            p.lost_samples = e.get("lost_samples", 0)
            self.procs.append(p)
        self._tables: dict = {}
        if private:  # a dataset in a temporary folder goes with this store
            weakref.finalize(self, shutil.rmtree, root, True)

    @classmethod
    def open(cls, path: str, manifest: dict, cache: bool, want: Optional[bool],
             catalog: Catalog) -> Optional["DatasetStore"]:
        """The run's cached dataset, or one built now when ``want`` (None: when the traces
        hold more than LARGE_BYTES); None for the in-memory store."""
        key = hashlib.sha1(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
        cache_root = os.path.join(path, CACHE_DIR, f"dataset-{key}")
        entries = read_manifest(cache_root) if cache else None
        if entries is None and cache and os.path.isdir(cache_root):
            shutil.rmtree(cache_root, ignore_errors=True)  # a damaged manifest: the dataset is built again
        if entries is not None:
            return cls(cache_root, entries, catalog)
        if want is None:
            want = sum(size for size, _ in manifest["traces"].values()) >= LARGE_BYTES
        if not want:
            return None
        built = _build(path, cache_root, cache, catalog)
        return None if built is None else cls(built[0], built[1], catalog, *built[2:])

    @property
    def large(self) -> bool:
        """Too many events to hold at once: read a selection at a time."""
        return self.data.large and "events" not in self._tables

    def has(self, name: str) -> bool:
        return name in self._tables

    def table(self, name: str) -> pd.DataFrame:
        if name not in self._tables:
            self._tables[name] = self.data.table(name)
        return self._tables[name]

    def select(self, categories=None, kinds=None, names=None, processes=None, columns=None,
               during=None) -> pd.DataFrame:
        if self.large:
            return self.data.select(categories, kinds, names, processes, columns, during)
        return select_rows(self.table("events"), categories, kinds, names, processes, columns, during)

    def gpu_select(self, table: str, during=None, columns=None) -> pd.DataFrame:
        """A GPU table's rows overlapping ``during``, read without the rest where the run is large."""
        if not (self.large and table not in self._tables and during is not None):
            return window_rows(self.table(table), during, columns)
        if not len(during):
            return self.data.table(table, columns=columns).iloc[:0]
        return self.data.table(table, filter=overlapping(during), columns=columns, during=during)

    def select_phases(self, names=None, modes=None, steps=None, columns=None) -> pd.DataFrame:
        """Phases of these names, modes and step numbers; a large run's read with the
        filter pushed into the scan (its phases table may be tens of millions of rows)."""
        if not self.large or "phases" in self._tables:
            return phase_rows(self.table("phases"), names, modes, steps, columns)
        import pyarrow.dataset as ds

        conditions = [ds.field(c).isin([str(w) for w in wanted] if c != "step" else [int(w) for w in wanted])
                      for c, wanted in (("name", names), ("mode", modes), ("step", steps)) if wanted is not None]
        where = None
        for c in conditions:
            where = c if where is None else where & c
        return self.data.table("phases", filter=where, columns=columns)

    def event_names(self) -> list:
        return self.data.names()

    def ranks_with_events(self) -> int:
        ranks = set()
        for p in self.procs:
            rank = p.meta.get("rank") if p.meta.get("rank") is not None else p.meta.get("parent_rank")
            if rank is not None and p.events:
                ranks.add(int(rank))
        return max(1, len(ranks))

    def extents(self) -> pd.DataFrame:
        return self.data.extents()

    def rows(self, name: str) -> int:
        """Rows of a table: as the dataset's manifest counts them, until it is read."""
        if name in self._tables:
            return len(self._tables[name])
        return sum(int(e.get("rows", {}).get(name, 0)) for e in self.data.entries)

    def py_raw(self):
        return self.data.py_raw()

    def sql_views(self, con) -> set:
        """DuckDB views over a large run's tables that have files; the others stay pandas."""
        return set(duckdb_views(con, self.root)) if self.large else set()

    def link_tables(self, out_dir: str) -> set:
        """Hard links (copies across file systems) of a large run's table folders, as they are;
        returns the tables (none for a run small enough to write its tables whole)."""
        done = set()
        if not self.large:
            return done
        for table in table_folders(self.root):
            src = os.path.join(self.root, table)
            for folder, _, names in os.walk(src):
                dest = os.path.join(out_dir, table, os.path.relpath(folder, src))
                os.makedirs(dest, exist_ok=True)
                for f in names:
                    target = os.path.join(dest, f)
                    if os.path.exists(target):
                        os.remove(target)
                    try:
                        os.link(os.path.join(folder, f), target)
                    except OSError:
                        shutil.copy2(os.path.join(folder, f), target)
            done.add(table)
        return done


def _build(path: str, cache_root: str, cache: bool, catalog: Catalog):
    """Builds the dataset beside the run (reused by the next load when the run is
    complete), or in a private temporary folder (the run folder is read-only, the
    cache is off, or the run is still being written); (root, entries[, private])."""
    folders = process_folders(path)
    if not folders:
        return None
    tmp_parent = os.path.join(path, CACHE_DIR)
    try:
        if not cache:
            raise OSError("cache off")
        files.make_dirs(tmp_parent)
        tmp = tempfile.mkdtemp(prefix="building-", dir=tmp_parent)
    except OSError:
        tmp = tempfile.mkdtemp(prefix="stepscope-dataset-")
        tmp_parent = None
    # a trace still being written keeps its finished parts here: the next build decodes only what is new
    live = os.path.join(tmp_parent, LIVE_DIR) if tmp_parent is not None else None
    entries = dataset_build.build(folders, tmp, catalog, live=live)
    files.narrow_tree(tmp_parent if tmp_parent is not None else tmp)  # pyarrow's files: the umask's mode
    complete = all(e["readable"] and e["clean_close"] for e in entries)
    if live is not None and complete:
        shutil.rmtree(live, ignore_errors=True)
    if tmp_parent is not None and complete:
        runinfo.write_json_atomic(os.path.join(tmp, "manifest.json"),
                                  {"version": CACHE_VERSION, "processes": entries})
        try:
            os.rename(tmp, cache_root)
            for old in os.listdir(tmp_parent):  # datasets of earlier states of the traces
                if old.startswith("dataset-") and old != os.path.basename(cache_root):
                    shutil.rmtree(os.path.join(tmp_parent, old), ignore_errors=True)
            return cache_root, entries
        except OSError:  # another process cached the same state first
            shutil.rmtree(tmp, ignore_errors=True)
            found = read_manifest(cache_root)
            if found is not None:
                return cache_root, found
            tmp = tempfile.mkdtemp(prefix="stepscope-dataset-")
            entries = dataset_build.build(folders, tmp, catalog)
    return tmp, entries, True


def read_manifest(root: str):
    try:
        with open(os.path.join(root, "manifest.json")) as f:
            saved = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(saved, dict) or saved.get("version") != CACHE_VERSION:
        return None
    return metadata.manifest_entries(saved)  # None (a key missing, a wrong shape): the dataset is rebuilt
