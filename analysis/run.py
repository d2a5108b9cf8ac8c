"""``stepscope.load(RUN)``: a run as pandas tables, and SQL over them (SPEC §8).

Tables are built on first use. A finished run's events are cached once as
Parquet beside the run (``<run>/.stepscope-cache/``), keyed on the size and
modification time of every trace file, so a second load skips decoding and
DuckDB, Spark or Trino can read the same files. A run still being written
loads too: whatever has been flushed so far.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import weakref
import warnings as _warnings
from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis import gpu, samples as pysamples, tables
from stepscope.analysis.reader import (ProcessTrace, RunFormatError, events_frame, read_processes,
                                       resolve_run_path)
from stepscope.analysis.store.schema import CACHE_VERSION, DATASET_TABLES, GPU_TABLES, RUN_TABLES  # noqa: F401 - GPU_TABLES: the run's API
from stepscope.core import files, metadata, runinfo
from stepscope.core.vocabulary import CACHE_DIR, RUN_JSON, TRACE_FILE

LIVE_DIR = "live"  # under the run's cache folder: finished parts of traces still being written
# Traces larger than this (about 8 M events) are read through the run's Parquet dataset, a process
# and a part at a time (analysis/dataset.py): the first load decodes into it, later ones only read it
LARGE_BYTES = 64 << 20
PY_CACHE = ("pysamples.parquet", "pystacks.parquet")
# What the in-memory cache's manifest keeps per process (the dataset's manifest keeps more)
CACHE_ENTRY_FIELDS = {k: metadata.MANIFEST_ENTRY_FIELDS[k] for k in ("folder", "meta", "warnings", "events", "dropped")}


def _trace_files(path: str) -> dict:
    out = {}
    for d in sorted(os.listdir(path)):
        trace = os.path.join(path, d, TRACE_FILE)
        if os.path.isfile(trace):
            st = os.stat(trace)
            out[d] = [st.st_size, st.st_mtime_ns]
    return out


FOLDED_NAME = "(other names)"  # csrc/record/recorder.h kOverflowName


def _names_folded(meta) -> int:
    """The events a process recorded under FOLDED_NAME (process.json's writer stats)."""
    stats = meta.get("stats") if isinstance(meta, dict) else None
    value = stats.get("names_folded") if isinstance(stats, dict) else None
    return value if isinstance(value, int) and value > 0 else 0


class Run:
    """A recorded run: ``events``, ``steps``, ``phases``, ``system``, ``kernels``,
    ``memcpy``, ``memset``, ``sync``, ``cuda_api``, ``processes`` as DataFrames;
    ``sql(query)`` over them; ``dropped_events``,
    ``warnings`` (damage found while reading) and ``notes`` (what was not measured).
    """

    def __init__(self, path, quiet: bool = False, cache: bool = True, dataset: Optional[bool] = None):
        self.path = resolve_run_path(path)
        self.name = os.path.basename(os.path.normpath(self.path))
        self.info, info_notes = metadata.read(os.path.join(self.path, RUN_JSON), metadata.RUN_FIELDS)
        self._cache_ok = cache
        self._want_dataset = dataset  # None: when the traces hold more than LARGE_BYTES
        self._manifest = {"version": CACHE_VERSION, "traces": _trace_files(self.path)}
        self._data = None  # the run's Parquet dataset (analysis/dataset.py), when read from one
        self._procs = self._dataset_processes() or self._cached_processes() or read_processes(self.path)
        if not self._procs and not self.info:
            raise RunFormatError(f"{self.path} is not a stepscope run (no run.json, no process folders)")
        self.warnings = info_notes + [w for p in self._procs for w in p.warnings]
        self.dropped_events = sum(p.dropped for p in self._procs)
        self.names_folded = sum(_names_folded(p.meta) for p in self._procs)
        if self.names_folded:
            self.warnings.append(f"{self.names_folded} events were recorded as {FOLDED_NAME!r}: their processes "
                                 f"named more than stepscope's name table holds (docs/design.md, Names)")
        self.dropped_samples = sum(p.lost_samples for p in self._procs)  # stacks lost to damage (warned about)
        if not quiet:
            level = _caller_stacklevel()
            for w in self.warnings:
                _warnings.warn(f"stepscope: {w}", stacklevel=level)
            if self.dropped_events:
                _warnings.warn(f"stepscope: {self.dropped_events} events were dropped while recording "
                               f"{self.name} (the writer could not keep up)", stacklevel=level)
        self._tables: dict = {}
        self._db = None

    def __repr__(self) -> str:
        return f"<stepscope.Run {self.path!r}: {len(self._procs)} process(es)>"

    # --- tables ---------------------------------------------------------------------
    @property
    def events(self) -> pd.DataFrame:
        """Every event. A large run (read from its dataset) builds this table only when
        asked: analysis itself reads what it needs through ``select``."""
        if "events" not in self._tables:
            if self._data is not None:
                self._tables["events"] = self._data.table("events")
            else:
                self._tables["events"] = self._cached_events()
        return self._tables["events"]

    @property
    def large(self) -> bool:
        """Too many events to hold at once: read from the dataset, a selection at a time."""
        return self._data is not None and self._data.large and "events" not in self._tables

    def select(self, categories=None, kinds=None, names=None, processes=None, columns=None,
               during=None) -> pd.DataFrame:
        """The events of these categories, kinds, names and processes (each a list, or
        None for all), and overlapping one of the times in ``during`` ([(start_ns,
        end_ns)], None: any time), without building the events table of a large run."""
        if self.large:
            return self._data.select(categories, kinds, names, processes, columns, during)
        ev = self.events
        mask = np.ones(len(ev), dtype=bool)
        for column, wanted in (("category", categories), ("kind", kinds), ("name", names),
                               ("process", processes)):
            if wanted is not None:
                mask &= ev[column].isin(list(wanted)).to_numpy()
        if during is not None:
            start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
            near = np.zeros(len(ev), dtype=bool)
            for t0, t1 in during:
                near |= (start < t1) & (end > t0)
            mask &= near
        out = ev[mask] if not mask.all() else ev
        return out if columns is None else out[[c for c in columns if c in out.columns]]

    def event_names(self, containing: Optional[str] = None) -> list:
        """The names events of this run carry (``containing``: only those with this text)."""
        if self._data is not None:
            names = self._data.names()
        else:
            names = [str(n) for n in self.events["name"].cat.categories]
        return [n for n in names if containing is None or containing in n]

    def ranks_with_events(self) -> int:
        """How many ranks recorded events (1 for a job that is not distributed)."""
        if self._data is not None:
            ranks = set()
            for p in self._procs:
                rank = p.meta.get("rank") if p.meta.get("rank") is not None else p.meta.get("parent_rank")
                if rank is not None and p.events:
                    ranks.add(int(rank))
            return max(1, len(ranks))
        ev = self.events
        return int(max(1, ev["rank"].nunique())) if len(ev) else 1

    def extents(self) -> pd.DataFrame:
        """Per process: first event start, last event end (wall-clock ns), events, and
        those recorded by the job's work (not system samples or stepscope's own)."""
        if self._data is not None:
            return self._data.extents()
        ev = self.events
        if not len(ev):
            return pd.DataFrame(columns=["start_ns", "end_ns", "events", "recorded"])
        work = ~ev["category"].isin(["system", "internal"])
        return pd.DataFrame({"start_ns": ev.groupby("process", observed=True, sort=False)["start_ns"].min(),
                             "end_ns": ev.groupby("process", observed=True, sort=False)["end_ns"].max(),
                             "events": ev.groupby("process", observed=True, sort=False).size(),
                             "recorded": work.groupby(ev["process"], observed=True, sort=False).sum()})

    def _steps_and_phases(self):
        if "steps" not in self._tables:
            if self._data is not None:
                self._tables["steps"], self._tables["phases"] = self._data.table("steps"), self._data.table("phases")
                return
            self._tables["steps"], self._tables["phases"] = tables.steps_and_phases(self.events)

    @property
    def steps(self) -> pd.DataFrame:
        self._steps_and_phases()
        return self._tables["steps"]

    @property
    def phases(self) -> pd.DataFrame:
        self._steps_and_phases()
        return self._tables["phases"]

    @property
    def ops(self) -> pd.DataFrame:
        """Operator events of the sampled steps, with phase, self time, shapes (analysis/ops.py)."""
        if "ops" not in self._tables:
            from stepscope.analysis.ops import ops_frame

            self._tables["ops"] = ops_frame(self.select(categories=["op"]), self.steps, self.phases)
        return self._tables["ops"]

    def op_summary(self, top: int = 0) -> pd.DataFrame:
        """Per phase and operator over the sampled steps: count, self/total time, share of the phase."""
        from stepscope.analysis.ops import op_summary

        return op_summary(self.ops, self.steps, top)

    @property
    def system(self) -> pd.DataFrame:
        if "system" not in self._tables:
            from stepscope.analysis.system import system_frame

            self._tables["system"] = self._data.table("system") if self._data is not None \
                else system_frame(self.events)
        return self._tables["system"]

    def _gpu(self, name: str) -> pd.DataFrame:
        if name not in self._tables and self._data is not None:
            self._tables[name] = self._data.table(name)
        if name not in self._tables:
            self.events  # decodes the traces (or reads the cache), GPU records included
            self._tables.update(gpu.gpu_tables(self._gpu_raw, self.steps, self.phases))
        return self._tables[name]

    def _kernel_aggregate(self, name: str) -> pd.DataFrame:
        if name not in self._tables:
            from stepscope.analysis import kernel_steps

            if self._data is not None:
                self._tables[name] = self._data.table(name)
            else:
                self._tables.update(kernel_steps.aggregate(self.kernels))
        return self._tables[name]

    @property
    def kernel_steps(self) -> pd.DataFrame:
        """Compute kernels per (process, device, step): count, time, busy time, gaps and
        launch gaps (analysis/kernel_steps.py). A large run reads it without its kernels."""
        return self._kernel_aggregate("kernel_steps")

    @property
    def kernel_phases(self) -> pd.DataFrame:
        """``kernel_steps``' additive figures split by the phase that launched the kernels."""
        return self._kernel_aggregate("kernel_phases")

    @property
    def kernel_names(self) -> pd.DataFrame:
        """Every kernel's count and time per (process, device, mode, name)."""
        return self._kernel_aggregate("kernel_names")

    def gpu_select(self, table: str, during=None, columns=None) -> pd.DataFrame:
        """A GPU table's rows overlapping one of the times in ``during`` ([(start_ns,
        end_ns)], None: all), without building the table of a large run."""
        if self.large and table not in self._tables and during is not None:
            from stepscope.analysis.dataset import overlapping

            if not len(during):
                return self._data.table(table, columns=columns).iloc[:0]
            return self._data.table(table, filter=overlapping(during), columns=columns, during=during)
        frame = getattr(self, table)
        if during is not None:
            start, end = frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy()
            near = np.zeros(len(frame), dtype=bool)
            for t0, t1 in during:
                near |= (start < t1) & (end > t0)
            frame = frame[near]
        return frame if columns is None else frame[[c for c in columns if c in frame.columns]]

    def window(self, during) -> "RunWindow":
        """This run seen through times [(start_ns, end_ns)]: its events, steps and GPU
        records overlapping one of them (read with the filter pushed into a large run's
        scan); everything else as the run has it. The exports take one as a run."""
        return RunWindow(self, during)

    def rows(self, table: str) -> int:
        """Rows of a table, without building it when the run's dataset knows the count."""
        if table not in self._tables and self._data is not None:
            return sum(int(e.get("rows", {}).get(table, 0)) for e in self._data.entries)
        return len(getattr(self, table))

    @property
    def kernels(self) -> pd.DataFrame:
        """GPU kernels, each with its launch, step, phase and precision (analysis/gpu.py)."""
        return self._gpu("kernels")

    @property
    def memcpy(self) -> pd.DataFrame:
        return self._gpu("memcpy")

    @property
    def memset(self) -> pd.DataFrame:
        return self._gpu("memset")

    @property
    def sync(self) -> pd.DataFrame:
        return self._gpu("sync")

    @property
    def cuda_api(self) -> pd.DataFrame:
        return self._gpu("cuda_api")

    @property
    def samples(self) -> pd.DataFrame:
        """Python stack samples with their leaf frame, step, mode and phase (analysis/samples.py)."""
        if "samples" not in self._tables:
            if self._data is None:
                self.events  # decodes the traces (or reads the cache), samples included
            raw = getattr(self, "_py_raw", None)
            if raw is None:
                raw = self._data.py_raw() if self._data is not None \
                    else pysamples.raw_frames(read_processes(self.path))
            self._tables["stacks"] = raw[1]
            self._tables["samples"] = pysamples.samples_frame(raw[0], raw[1], self.steps, self.phases)
        return self._tables["samples"]

    @property
    def stacks(self) -> pd.DataFrame:
        """The distinct Python stacks of ``samples``: stack id, parent, depth and leaf frame."""
        self.samples
        return self._tables["stacks"]

    @property
    def sample_functions(self) -> pd.DataFrame:
        """Per phase and function: self and total samples and the time they stand for."""
        if "sample_functions" not in self._tables:
            self._tables["sample_functions"] = pysamples.by_function(self.samples, self.stacks)
        return self._tables["sample_functions"]

    @property
    def notes(self) -> list:
        """What could not be measured in this run, and why."""
        return list(self.info.get("notes", []))

    @property
    def versions(self) -> dict:
        """Versions of what the run's processes had imported (frameworks, Python): run.json's,
        completed from every process.json (a process that started the run may not be the
        one that trained)."""
        out = dict(self.info.get("versions") or {})
        for p in self._procs:
            for name, version in (p.meta.get("versions") or {}).items():
                out.setdefault(name, version)
        return out

    @property
    def processes(self) -> pd.DataFrame:
        rows = []
        for p in self._procs:
            rows.append({
                "process": os.path.basename(p.folder), "pid": p.meta.get("pid"),
                "host": p.meta.get("host"), "rank": p.meta.get("rank"),
                "local_rank": p.meta.get("local_rank"), "world_size": p.meta.get("world_size"),
                "origin": p.meta.get("origin"), "parent": p.meta.get("parent"),
                "start_time": p.meta.get("process_start_time", p.meta.get("start_time")),
                "session_start": p.meta.get("start_time"),
                "events": p.events, "dropped": p.dropped, "dropped_samples": p.lost_samples,
                "clean_close": p.clean_close,
                "readable": p.readable,
            })
        return pd.DataFrame(rows)

    # --- SQL ------------------------------------------------------------------------
    def sql(self, query: str) -> pd.DataFrame:
        """Runs a DuckDB query over the tables (events, steps, phases, system, kernels, ...:
        every table of ``RUN_TABLES``, each built only when the query names it)."""
        import duckdb

        if self._db is None:
            self._db = duckdb.connect()
            # a large run's tables are views over its dataset: DuckDB reads what the query needs
            self._views = dataset_views(self._db, self._data) if self._data is not None and self.large else set()
        for name in RUN_TABLES:
            if name.lower() in query.lower() and name not in self._views:
                self._db.register(name, getattr(self, name))
        return self._db.execute(query).df()

    # --- Parquet cache --------------------------------------------------------------
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
        self._from_cache = True
        return procs

    def _cached_events(self) -> pd.DataFrame:
        cache_dir, cached, _ = self._cache_paths()
        if getattr(self, "_from_cache", False):
            try:
                events = _read_parquet(cached)
                self._gpu_raw = _read_parquet(self._gpu_cache_path())
                self._py_raw = tuple(_read_parquet(os.path.join(cache_dir, f)) for f in PY_CACHE)
                return events
            except Exception:  # noqa: BLE001 - a damaged cache: decode the traces instead
                self._procs = read_processes(self.path)
        complete = all(p.readable and p.clean_close for p in self._procs)
        self._gpu_raw = gpu.raw_frame(self._procs)  # first: events_frame releases the decoded columns
        self._py_raw = pysamples.raw_frames(self._procs)
        events = events_frame(self._procs)
        self._release_columns()
        if self._cache_ok and complete and len(events):
            manifest = dict(self._manifest, processes=[
                {"folder": p.folder, "meta": p.meta, "warnings": p.warnings, "events": p.events,
                 "dropped": p.dropped, "lost_samples": p.lost_samples} for p in self._procs])
            # Written beside the caller's work; the interpreter waits for it at exit.
            threading.Thread(target=self._write_cache, args=(events, self._gpu_raw, cache_dir, cached, manifest,
                                                             self._py_raw),
                             name="stepscope-parquet-cache").start()
        return events

    # --- the dataset (analysis/dataset.py) --------------------------------------------
    def _dataset_processes(self):
        """Reads the run from its Parquet dataset when one is cached, or builds one when
        the run is too large to decode at once (``dataset=True``: always); returns the
        processes, or None for the in-memory path."""
        from stepscope.analysis import dataset

        key = hashlib.sha1(json.dumps(self._manifest, sort_keys=True).encode()).hexdigest()[:16]
        cache_root = os.path.join(self.path, CACHE_DIR, f"dataset-{key}")
        entries = _read_manifest(cache_root) if self._cache_ok else None
        if entries is None and self._cache_ok and os.path.isdir(cache_root):
            shutil.rmtree(cache_root, ignore_errors=True)  # a damaged manifest: the dataset is built again
        if entries is None:
            want = self._want_dataset
            if want is None:
                want = sum(size for size, _ in self._manifest["traces"].values()) >= LARGE_BYTES
            if not want:
                return None
            entries, root = self._build_dataset(cache_root)
            if entries is None:
                return None
        else:
            root = cache_root
        self._data = dataset.Dataset(root, entries)
        procs = []
        for e in entries:
            p = ProcessTrace(e["folder"], e["meta"], None, e["warnings"])
            p.readable, p.events, p.dropped, p.clean_close = e["readable"], e["events"], e["dropped"], e["clean_close"]
            p.lost_samples = e.get("lost_samples", 0)
            procs.append(p)
        return procs

    def _build_dataset(self, cache_root: str):
        """Builds the dataset beside the run (reused by the next load when the run is
        complete), or in a private temporary folder (the run folder is read-only, the
        cache is off, or the run is still being written)."""
        from stepscope.analysis import dataset
        from stepscope.analysis.reader import process_folders

        folders = process_folders(self.path)
        if not folders:
            return None, None
        tmp_parent = os.path.join(self.path, CACHE_DIR)
        try:
            if not self._cache_ok:
                raise OSError("cache off")
            files.make_dirs(tmp_parent)
            tmp = tempfile.mkdtemp(prefix="building-", dir=tmp_parent)
        except OSError:
            tmp = tempfile.mkdtemp(prefix="stepscope-dataset-")
            tmp_parent = None
        # a trace still being written keeps its finished parts here: the next build decodes only what is new
        live = os.path.join(tmp_parent, LIVE_DIR) if tmp_parent is not None else None
        entries = dataset.build(folders, tmp, live=live)
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
                return entries, cache_root
            except OSError:  # another process cached the same state first
                shutil.rmtree(tmp, ignore_errors=True)
                found = _read_manifest(cache_root)
                if found is not None:
                    return found, cache_root
                tmp = tempfile.mkdtemp(prefix="stepscope-dataset-")
                entries = dataset.build(folders, tmp)
        weakref.finalize(self, shutil.rmtree, tmp, True)  # private: goes with this Run
        return entries, tmp

    def _release_columns(self) -> None:
        for p in self._procs:  # the events table holds everything now
            p.release()

    @staticmethod
    def _write_cache(events, gpu_raw, cache_dir, cached, manifest, py_raw=()) -> None:
        try:
            files.make_dirs(cache_dir)
            py = [(frame, os.path.join(cache_dir, f)) for frame, f in zip(py_raw, PY_CACHE)]
            for frame, path in (*py, (gpu_raw, os.path.join(cache_dir, "gpu.parquet")), (events, cached)):
                tmp = f"{path}.tmp{os.getpid()}"
                _write_parquet(frame, tmp)
                os.replace(tmp, path)
            runinfo.write_json_atomic(os.path.join(cache_dir, "manifest.json"), manifest)
            files.narrow_tree(cache_dir)  # pyarrow's files: the umask's mode
        except Exception:  # noqa: BLE001 - a read-only run folder just means no cache
            pass


def dataset_views(con, data) -> set:
    """DuckDB views over the dataset's tables that have files; the others stay pandas."""
    from stepscope.analysis import dataset

    return set(dataset.duckdb_views(con, data.root))


class RunWindow:
    """What ``Run.window`` returns: the run's attributes, with the time-bound tables filtered."""

    def __init__(self, run: Run, during):
        self._run, self.during = run, [(int(a), int(b)) for a, b in during]
        self._tables = {}

    def __getattr__(self, name):
        return getattr(self._run, name)

    def _near(self, frame: pd.DataFrame) -> pd.DataFrame:
        start, end = frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy()
        near = np.zeros(len(frame), dtype=bool)
        for t0, t1 in self.during:
            near |= (start < t1) & (end > t0)
        return frame[near]

    @property
    def events(self) -> pd.DataFrame:
        if "events" not in self._tables:
            self._tables["events"] = self._run.select(during=self.during)
        return self._tables["events"]

    @property
    def steps(self) -> pd.DataFrame:
        return self._near(self._run.steps)

    @property
    def phases(self) -> pd.DataFrame:
        return self._near(self._run.phases)

    def _gpu(self, name: str) -> pd.DataFrame:
        if name not in self._tables:
            self._tables[name] = self._run.gpu_select(name, self.during)
        return self._tables[name]

    kernels = property(lambda self: self._gpu("kernels"))
    memcpy = property(lambda self: self._gpu("memcpy"))
    memset = property(lambda self: self._gpu("memset"))
    sync = property(lambda self: self._gpu("sync"))
    cuda_api = property(lambda self: self._gpu("cuda_api"))

    def gpu_select(self, table: str, during=None, columns=None) -> pd.DataFrame:
        frame = self._gpu(table)
        if during is not None:
            frame = RunWindow(self._run, during)._near(frame)
        return frame if columns is None else frame[[c for c in columns if c in frame.columns]]


def _read_manifest(root: str):
    try:
        with open(os.path.join(root, "manifest.json")) as f:
            saved = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(saved, dict) or saved.get("version") != CACHE_VERSION:
        return None
    return metadata.manifest_entries(saved)  # None (a key missing, a wrong shape): the dataset is rebuilt


def _read_parquet(path: str) -> pd.DataFrame:
    """Parquet to pandas a column at a time, so the peak is the table plus one column
    rather than two copies of the table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    frame = pd.DataFrame({name: pq.read_table(path, columns=[name]).to_pandas(self_destruct=True)[name]
                          for name in names}, copy=False)
    pa.default_memory_pool().release_unused()  # give Arrow's freed buffers back
    return frame


def _write_parquet(frame: pd.DataFrame, path: str, rows_per_group: int = 1 << 20) -> None:
    """Parquet in row groups converted one at a time: Arrow holds one group, not a
    second copy of the table (the cache is written while the caller builds tables)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.Schema.from_pandas(frame.iloc[:0], preserve_index=False)
    with pq.ParquetWriter(path, schema) as writer:
        for at in range(0, max(len(frame), 1), rows_per_group):
            part = pa.Table.from_pandas(frame.iloc[at:at + rows_per_group], schema=schema, preserve_index=False)
            writer.write_table(part)


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside stepscope: a warning points at the
    user's line (stepscope.load, stepscope.analysis.load or Run alike)."""
    import sys

    frame, level = sys._getframe(1), 1
    while frame is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] == "stepscope":
        frame, level = frame.f_back, level + 1
    return level


def load(run, quiet: bool = False, cache: bool = True, dataset: Optional[bool] = None) -> Run:
    """Loads a run folder (or a run name under STEPSCOPE_DIR). ``dataset``: read it
    through its partitioned Parquet dataset (None: when it is large)."""
    return Run(run, quiet=quiet, cache=cache, dataset=dataset)


def export_parquet(run: Run, out_dir: Optional[str] = None) -> str:
    """Writes every table as Parquet (for DuckDB, Spark, Trino); returns the folder.
    A large run's tables are its dataset's (docs/format.md), linked or copied as they
    are: ``<table>/process=<process>/part-*.parquet``, none of them built in memory."""
    out_dir = out_dir or os.path.join(run.path, "parquet")
    files.make_dirs(out_dir)
    linked = _link_dataset(run._data.root, out_dir) if run.large else set()
    for name in RUN_TABLES:
        if name in linked:
            continue
        frame = getattr(run, name)
        with files.open_new(os.path.join(out_dir, f"{name}.parquet"), "wb") as f:
            frame.to_parquet(f, index=False)
    files.narrow_tree(out_dir)  # the linked dataset's folders and copies
    return out_dir


def _link_dataset(root: str, out_dir: str) -> set:
    """Hard links (copies across file systems) of the dataset's table folders; returns the tables."""

    done = set()
    for table in DATASET_TABLES:
        src = os.path.join(root, table)
        if not os.path.isdir(src):
            continue
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
