"""``stepscope.load(RUN)``: a run as pandas tables, and SQL over them (SPEC §8).

``Run`` is the public API only: every table comes from the run's store
(``analysis/store/``), the traces decoded in memory or the run's Parquet dataset,
chosen when the run is opened (``store.choose``). Tables are built on first use. A
run still being written loads too: whatever has been flushed so far.
"""

from __future__ import annotations

import os
import warnings as _warnings
from typing import Optional

import pandas as pd

from stepscope.analysis.tables import ops, samples as pysamples
from stepscope.analysis.tables.catalog import catalog
from stepscope.analysis.store.reader import RunFormatError, resolve_run_path
from stepscope.analysis.store.choose import open_store
from stepscope.analysis.store.memory import overlapping_rows, phase_rows
from stepscope.analysis.store.schema import GPU_TABLES  # noqa: F401 - the run's API
from stepscope.core import files, metadata
from stepscope.core.vocabulary import RUN_JSON

DERIVED_TABLES = ("ops", "samples", "stacks")  # built by ``Run`` from the store's selections

FOLDED_NAME = "(other names)"  # csrc/record/recorder.h kOverflowName


def _rank_or_folder(proc) -> str:
    rank = proc.meta.get("rank") if isinstance(proc.meta, dict) else None
    return str(rank) if isinstance(rank, int) else os.path.basename(os.path.normpath(proc.folder))


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
        self._catalog = catalog()
        self._store = open_store(self.path, self._catalog, cache=cache, dataset=dataset)
        if not self._procs and not self.info:
            raise RunFormatError(f"{self.path} is not a stepscope run (no run.json, no process folders)")
        self.warnings = info_notes + [w for p in self._procs for w in p.warnings]
        self.dropped_events = sum(p.dropped for p in self._procs)
        # per rank (a process without one: its folder), those whose writer dropped events
        self.dropped_by_rank = {_rank_or_folder(p): int(p.dropped) for p in self._procs if p.dropped}
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
        self._derived: dict = {}  # tables built here from the store's (ops, samples...)
        self._memo: dict = {}  # what rules derive alike (``memo``)
        self._db = None

    @property
    def _procs(self) -> list:
        """The processes' traces (metadata, counts, warnings), as the store read them."""
        return self._store.procs

    def __repr__(self) -> str:
        return f"<stepscope.Run {self.path!r}: {len(self._procs)} process(es)>"

    @property
    def tables(self) -> tuple:
        """The names of every table (``run.<name>``, ``run.table(name)``, ``run.sql``'s names)."""
        return (*self._catalog.names, *DERIVED_TABLES)

    def table(self, name: str) -> pd.DataFrame:
        """A table by name: one of ``tables`` (a plugin's included)."""
        if name in DERIVED_TABLES:
            return getattr(self, name)
        if name not in self._catalog.names:
            raise KeyError(f"{name!r} is not a table of this run (tables: {', '.join(self.tables)})")
        return self._store.table(name)

    def __getattr__(self, name: str):
        # (only for what is not found otherwise: the tables plugins add, as attributes)
        tables = self.__dict__.get("_catalog")
        if tables is not None and not name.startswith("_") and name in tables.names:
            return self._store.table(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def memo(self, key, build):
        """``build()``, computed once per loaded run: the frames several rules derive
        alike (the train steps after warm-up, the loop's windows), which on a run of
        millions of steps take a second each."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    # --- tables ---------------------------------------------------------------------
    @property
    def events(self) -> pd.DataFrame:
        """Every event. A large run (read from its dataset) builds this table only when
        asked: analysis itself reads what it needs through ``select``."""
        return self._store.table("events")

    @property
    def large(self) -> bool:
        """Too many events to hold at once: read from the dataset, a selection at a time."""
        return self._store.large

    def select(self, categories=None, kinds=None, names=None, processes=None, columns=None,
               during=None) -> pd.DataFrame:
        """The events of these categories, kinds, names and processes (each a list, or
        None for all), and overlapping one of the times in ``during`` ([(start_ns,
        end_ns)], None: any time), without building the events table of a large run."""
        return self._store.select(categories, kinds, names, processes, columns, during)

    def select_phases(self, names=None, modes=None, steps=None, columns=None) -> pd.DataFrame:
        """The phases of these names, modes and step numbers (each a list, None: all),
        ``columns`` only, without building the phases table of a large run."""
        return self._store.select_phases(names, modes, steps, columns)

    def event_names(self, containing: Optional[str] = None) -> list:
        """The names events of this run carry (``containing``: only those with this text)."""
        return [n for n in self._store.event_names() if containing is None or containing in n]

    def ranks_with_events(self) -> int:
        """How many ranks recorded events (1 for a job that is not distributed)."""
        return self._store.ranks_with_events()

    def extents(self) -> pd.DataFrame:
        """Per process: first event start, last event end (wall-clock ns), events, and
        those recorded by the job's work (not system samples or stepscope's own)."""
        return self._store.extents()

    @property
    def steps(self) -> pd.DataFrame:
        return self._store.table("steps")

    @property
    def phases(self) -> pd.DataFrame:
        return self._store.table("phases")

    @property
    def collectives(self) -> pd.DataFrame:
        """One row per collective a process issued (torch.distributed, DDP's buckets):
        kind, group, number in its group, bytes, its call and its completion
        (``analysis/tables/comm.py``)."""
        from stepscope.analysis.communication import comm_tables

        return comm_tables(self)[0]

    @property
    def ops(self) -> pd.DataFrame:
        """Operator events of the sampled steps, with phase, self time, shapes (analysis/tables/ops.py)."""
        if "ops" not in self._derived:
            events = self.select(categories=["op"])  # (the phases are read only where there are ops)
            self._derived["ops"] = ops.ops_frame(events, self.steps, self.phases if len(events) else None)
        return self._derived["ops"]

    def op_summary(self, top: int = 0) -> pd.DataFrame:
        """Per phase and operator over the sampled steps: count, self/total time, share of the phase."""
        return ops.op_summary(self.ops, self.steps, top)

    @property
    def system(self) -> pd.DataFrame:
        return self._store.table("system")

    def _gpu(self, name: str) -> pd.DataFrame:
        return self._store.table(name)

    @property
    def kernel_steps(self) -> pd.DataFrame:
        """Compute kernels per (process, device, step): count, time, busy time, gaps and
        launch gaps (analysis/tables/kernel_steps.py). A large run reads it without its kernels."""
        return self._store.table("kernel_steps")

    @property
    def kernel_phases(self) -> pd.DataFrame:
        """``kernel_steps``' additive figures split by the phase that launched the kernels."""
        return self._store.table("kernel_phases")

    @property
    def kernel_names(self) -> pd.DataFrame:
        """Every kernel's count and time per (process, device, mode, name)."""
        return self._store.table("kernel_names")

    def gpu_select(self, table: str, during=None, columns=None) -> pd.DataFrame:
        """A GPU table's rows overlapping one of the times in ``during`` ([(start_ns,
        end_ns)], None: all), without building the table of a large run."""
        return self._store.gpu_select(table, during, columns)

    def window(self, during) -> "RunWindow":
        """This run seen through times [(start_ns, end_ns)]: its events, steps and GPU
        records overlapping one of them (read with the filter pushed into a large run's
        scan); everything else as the run has it. The exports take one as a run."""
        return RunWindow(self, during)

    def rows(self, table: str) -> int:
        """Rows of a table, without building it when the run's dataset knows the count."""
        return len(self.table(table)) if table in DERIVED_TABLES else self._store.rows(table)

    @property
    def kernels(self) -> pd.DataFrame:
        """GPU kernels, each with its launch, step, phase and precision (analysis/tables/gpu.py)."""
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
        """Python stack samples with their leaf frame, step, mode and phase (analysis/tables/samples.py)."""
        if "samples" not in self._derived:
            raw = self._store.py_raw()
            self._derived["stacks"] = raw[1]
            phases = self.select_phases(columns=["process", "tid", "name", "start_ns", "end_ns"]) \
                if len(raw[0]) else pd.DataFrame()  # (a large run's phases are read only where there are samples)
            self._derived["samples"] = pysamples.samples_frame(raw[0], raw[1], self.steps, phases)
        return self._derived["samples"]

    @property
    def stacks(self) -> pd.DataFrame:
        """The distinct Python stacks of ``samples``: stack id, parent, depth and leaf frame."""
        self.samples
        return self._derived["stacks"]

    @property
    def sample_functions(self) -> pd.DataFrame:
        """Per phase and function: self and total samples and the time they stand for."""
        if "sample_functions" not in self._derived:
            self._derived["sample_functions"] = pysamples.by_function(self.samples, self.stacks)
        return self._derived["sample_functions"]

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
        every table of ``tables``, each built only when the query names it)."""
        import duckdb

        if self._db is None:
            self._db = duckdb.connect()
            # a large run's tables are views over its dataset: DuckDB reads what the query needs
            self._views = self._store.sql_views(self._db)
        for name in self.tables:
            if name.lower() in query.lower() and name not in self._views:
                self._db.register(name, self.table(name))
        return self._db.execute(query).df()


class RunWindow:
    """What ``Run.window`` returns: the run's attributes, with the time-bound tables filtered."""

    def __init__(self, run: Run, during):
        self._run, self.during = run, [(int(a), int(b)) for a, b in during]
        self._tables = {}

    def __getattr__(self, name):
        return getattr(self._run, name)

    def _near(self, frame: pd.DataFrame) -> pd.DataFrame:
        return frame[overlapping_rows(frame, self.during)]

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

    def select_phases(self, names=None, modes=None, steps=None, columns=None) -> pd.DataFrame:
        return phase_rows(self.phases, names, modes, steps, columns)

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
    linked = run._store.link_tables(out_dir)  # (a large run's: its dataset's files as they are)
    for name in run.tables:
        if name in linked:
            continue
        frame = run.table(name)
        with files.open_new(os.path.join(out_dir, f"{name}.parquet"), "wb") as f:
            frame.to_parquet(f, index=False)
    files.narrow_tree(out_dir)  # the linked dataset's folders and copies
    return out_dir
