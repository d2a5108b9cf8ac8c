"""Reads a run folder into pandas tables. Reads only the on-disk format.

Damage never stops a load: an unreadable process folder or a bad chunk is a
warning (naming the file, and the byte offset for chunks), and everything
readable is kept.
"""

from __future__ import annotations

import json
import os
import warnings as _warnings
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import pandas as pd

from stepscope.core import _native, runinfo
from stepscope.core.config import DEFAULT_DIR

KINDS = ("span", "instant", "counter")
PHASES = ("GetNext", "Forward", "Loss", "Backward", "Optimizer")
_STEP_CATEGORY = _native.CATEGORIES.index("step")
_PHASE_CATEGORY = _native.CATEGORIES.index("phase")

# Categories 0-15 exist on disk; names beyond the known ones keep their number.
_CATEGORY_NAMES = list(_native.CATEGORIES) + [f"cat{i}" for i in range(len(_native.CATEGORIES), 16)]

EVENT_COLUMNS = ["process", "pid", "host", "rank", "tid", "kind", "category", "name",
                 "start_ns", "end_ns", "duration_ns", "step", "arg", "value"]


class RunFormatError(ValueError):
    """A path that is not a stepscope run or trace."""


@dataclass
class ProcessTrace:
    """One process folder decoded: columns plus what the reader noticed."""

    folder: str
    meta: dict
    columns: Optional[dict]
    warnings: List[str] = field(default_factory=list)

    @property
    def dropped(self) -> int:
        return int(self.columns["dropped"]) if self.columns else 0


def resolve_run_path(run) -> str:
    """A run folder, or a run name under STEPSCOPE_DIR (SPEC §5)."""
    path = os.fspath(getattr(run, "path", run))
    if os.path.isdir(path):
        return path
    root = os.environ.get("STEPSCOPE_DIR") or DEFAULT_DIR
    candidate = os.path.join(root, path)
    if os.path.isdir(candidate):
        return candidate
    raise RunFormatError(f"no run at {path!r} (nor {candidate!r})")


def _read_process(folder: str) -> ProcessTrace:
    meta = {}
    notes = []
    try:
        with open(os.path.join(folder, "process.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        notes.append(f"{os.path.join(folder, 'process.json')}: unreadable ({exc}); using the trace header")
    trace = os.path.join(folder, meta.get("trace", "trace.ssc"))
    try:
        cols = _native.read_trace(trace)
    except (ValueError, OSError) as exc:
        notes.append(str(exc))
        return ProcessTrace(folder, meta, None, notes)
    notes.extend(cols["warnings"])
    try:
        header = json.loads(bytes(cols["header"]).decode() or "{}")
    except ValueError:
        header = {}
        notes.append(f"{trace}: unreadable header metadata")
    for key, value in header.items():
        meta.setdefault(key, value)
    if "clock" in header:
        meta["clock"] = header["clock"]
    return ProcessTrace(folder, meta, cols, notes)


def read_processes(run_path: str) -> List[ProcessTrace]:
    folders = sorted(
        os.path.join(run_path, d) for d in os.listdir(run_path)
        if os.path.isdir(os.path.join(run_path, d))
        and (os.path.exists(os.path.join(run_path, d, "trace.ssc"))
             or os.path.exists(os.path.join(run_path, d, "process.json"))))
    return [_read_process(f) for f in folders]


def events_frame(procs: List[ProcessTrace]) -> pd.DataFrame:
    """All events of all processes, wall-clock (epoch ns) times, sorted per thread by start."""
    cols = {k: [] for k in ("process", "pid", "rank", "rank_na", "host", "tid", "kind", "category",
                            "name", "start_ns", "end_ns", "step", "arg", "value")}
    processes, hosts, names, name_ids = [], [], [], {}
    for p in procs:
        c = p.columns
        if c is None or len(c["start"]) == 0:
            continue
        n = len(c["start"])
        clock = p.meta.get("clock", {})
        offset = int(clock.get("realtime_ns", 0)) - int(clock.get("monotonic_ns", 0))
        start, end = c["start"] + offset, c["end"] + offset
        # Per thread by start, parents (longer) before children; skip if already so.
        order = np.lexsort((start - end, start, c["track"]))
        if np.all(order[1:] > order[:-1]):
            order = slice(None)
        # Map this process's name ids onto the run-wide name list.
        local = list(c["names"])
        codes = c["name"].astype(np.int64)
        if n and int(codes.max()) >= len(local):  # a names chunk was lost to damage
            local += [f"<name {i}>" for i in range(len(local), int(codes.max()) + 1)]
        remap = np.array([name_ids.setdefault(nm, len(name_ids)) for nm in local], dtype=np.int64)
        rank = p.meta.get("rank") if p.meta.get("rank") is not None else p.meta.get("parent_rank")
        host = str(p.meta.get("host", ""))
        if host not in hosts:
            hosts.append(host)
        processes.append(os.path.basename(p.folder))
        cols["process"].append(np.full(n, len(processes) - 1, dtype=np.int32))
        cols["host"].append(np.full(n, hosts.index(host), dtype=np.int32))
        cols["pid"].append(np.full(n, int(p.meta.get("pid", -1)), dtype=np.int64))
        cols["rank"].append(np.full(n, -1 if rank is None else int(rank), dtype=np.int64))
        cols["rank_na"].append(np.full(n, rank is None))
        cols["tid"].append(c["track"][order])
        cols["kind"].append(c["kind"][order].astype(np.int8))
        cols["category"].append(c["category"][order].astype(np.int8))
        cols["name"].append(remap[codes[order]])
        cols["start_ns"].append(start[order])
        cols["end_ns"].append(end[order])
        cols["step"].append(c["step"][order])
        cols["arg"].append(c["arg"][order])
        cols["value"].append(c["value"][order])
    if not processes:
        return _empty_events()
    cat = {k: np.concatenate(v) for k, v in cols.items()}
    names = sorted(name_ids, key=name_ids.get)
    return pd.DataFrame({
        "process": pd.Categorical.from_codes(cat["process"], processes),
        "pid": cat["pid"],
        "host": pd.Categorical.from_codes(cat["host"], hosts),
        "rank": pd.arrays.IntegerArray(cat["rank"], cat["rank_na"]),
        "tid": cat["tid"],
        "kind": pd.Categorical.from_codes(cat["kind"], KINDS),
        "category": pd.Categorical.from_codes(cat["category"], _CATEGORY_NAMES),
        "name": pd.Categorical.from_codes(cat["name"], names),
        "start_ns": cat["start_ns"],
        "end_ns": cat["end_ns"],
        "duration_ns": cat["end_ns"] - cat["start_ns"],
        "step": cat["step"],
        "arg": cat["arg"],
        "value": cat["value"],
    }, copy=False)


def _empty_events() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
        ("process", "category"), ("pid", "int64"), ("host", "category"), ("rank", "Int64"),
        ("tid", "int64"), ("kind", "category"), ("category", "category"), ("name", "category"),
        ("start_ns", "int64"), ("end_ns", "int64"), ("duration_ns", "int64"), ("step", "int32"),
        ("arg", "int64"), ("value", "float64")]})


def steps_frame(events: pd.DataFrame) -> pd.DataFrame:
    """Steps from the step marks: each runs to the next mark of its process (SPEC §3).

    Per-phase columns hold the time of phase spans starting inside the step;
    Other is the step's time outside every phase.
    """
    cols = ["process", "pid", "rank", "mode", "step", "start_ns", "end_ns", "duration_ns"]
    marks = events[(events["category"] == "step") & (events["kind"] == "instant")]
    if marks.empty:
        return pd.DataFrame({c: [] for c in cols + list(PHASES) + ["Other"]})
    rows = []
    for process, m in marks.groupby("process", observed=True, sort=True):
        m = m.sort_values("start_ns", kind="stable")
        times = m["start_ns"].to_numpy()
        proc_events = events[events["process"] == process]
        last = int(proc_events["end_ns"].max())
        names = m["name"].astype(str).to_numpy()
        args = m["arg"].to_numpy()
        for i in range(len(m)):
            if names[i] == "end":
                continue
            end = int(times[i + 1]) if i + 1 < len(m) else last
            rows.append((process, int(m["pid"].iloc[i]), m["rank"].iloc[i], names[i], int(args[i]),
                         int(times[i]), end, end - int(times[i])))
    steps = pd.DataFrame(rows, columns=cols)
    steps = _add_phase_columns(steps, events)
    steps["rank"] = steps["rank"].astype("Int64")
    return steps


def exclusive_durations(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Each span's time minus the spans nested in it on the same thread.

    Phases nest when an optimizer runs forward and backward inside step()
    (LBFGS closures): the Optimizer phase keeps only its own time.
    """
    dur = end - start
    if len(dur) < 2:
        return dur
    order = np.lexsort((start - end, start, tid))  # per thread, parents first
    s, e, t = start[order], end[order], tid[order]
    if not np.any((t[1:] == t[:-1]) & (s[1:] < e[:-1])):
        return dur  # nothing nests: the common case, no Python loop
    excl = (e - s).copy()
    stack = []
    for i in range(len(s)):
        while stack and (t[stack[-1]] != t[i] or s[i] >= e[stack[-1]]):
            stack.pop()
        if stack:
            parent = stack[-1]
            excl[parent] -= min(e[i], e[parent]) - s[i]
        stack.append(i)
    out = np.empty_like(excl)
    out[order] = excl
    return out


def _add_phase_columns(steps: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    phases = events[(events["category"] == "phase") & (events["kind"] == "span")
                    & events["name"].isin(PHASES)]
    for name in PHASES:
        steps[name] = 0
    steps["Other"] = steps["duration_ns"]
    if phases.empty or steps.empty:
        return steps
    totals = np.zeros((len(steps), len(PHASES)), dtype=np.int64)
    covered = np.zeros(len(steps), dtype=np.int64)
    for process, idx in steps.groupby("process", observed=True).groups.items():
        s = steps.loc[np.asarray(idx)].sort_values("start_ns")
        starts = s["start_ns"].to_numpy()
        ends = s["end_ns"].to_numpy()
        rows = s.index.to_numpy()
        ph = phases[phases["process"] == process]
        p_start, p_end = ph["start_ns"].to_numpy(), ph["end_ns"].to_numpy()
        where = np.searchsorted(starts, p_start, side="right") - 1
        inside = (where >= 0) & (p_start < ends[np.clip(where, 0, None)])
        names = ph["name"].astype(str).to_numpy()
        durs = exclusive_durations(p_start, p_end, ph["tid"].to_numpy())
        for j, pname in enumerate(PHASES):
            sel = inside & (names == pname)
            np.add.at(totals[:, j], rows[where[sel]], durs[sel])
        # Time covered by any phase, counted once.
        covered_by_step = _union_lengths(where[inside], p_start[inside], p_end[inside])
        for w, length in covered_by_step.items():
            covered[rows[w]] = length
    for j, name in enumerate(PHASES):
        steps[name] = totals[:, j]
    steps["Other"] = np.maximum(steps["duration_ns"].to_numpy() - covered, 0)
    return steps


def _union_lengths(groups, starts, ends) -> dict:
    """Total length of the union of intervals, per group."""
    out = {}
    if len(groups) == 0:
        return out
    order = np.lexsort((starts, groups))
    g, s, e = groups[order], starts[order], ends[order]
    cur_g, cur_s, cur_e, total = g[0], s[0], e[0], 0
    for k in range(1, len(g)):
        if g[k] != cur_g or s[k] > cur_e:
            total += cur_e - cur_s
            if g[k] != cur_g:
                out[int(cur_g)] = int(total)
                total = 0
            cur_g, cur_s, cur_e = g[k], s[k], e[k]
        else:
            cur_e = max(cur_e, e[k])
    out[int(cur_g)] = int(total + cur_e - cur_s)
    return out


class Run:
    """A recorded run: ``events``, ``steps`` and ``processes`` as DataFrames.

    ``dropped_events`` counts events the writer could not keep up with;
    ``warnings`` lists damage found while reading (file and offset).
    """

    def __init__(self, path: str, quiet: bool = False):
        self.path = resolve_run_path(path)
        self.name = os.path.basename(os.path.normpath(self.path))
        self.info = runinfo.read_json(os.path.join(self.path, "run.json"))
        procs = read_processes(self.path)
        if not procs and not self.info:
            raise RunFormatError(f"{self.path} is not a stepscope run (no run.json, no process folders)")
        self._procs = procs
        self.warnings = [w for p in procs for w in p.warnings]
        self.dropped_events = sum(p.dropped for p in procs)
        if not quiet:
            for w in self.warnings:
                _warnings.warn(f"stepscope: {w}", stacklevel=3)
            if self.dropped_events:
                _warnings.warn(f"stepscope: {self.dropped_events} events were dropped while recording "
                               f"{self.name} (the writer could not keep up)", stacklevel=3)
        self._events = None
        self._steps = None
        self._system = None

    @property
    def events(self) -> pd.DataFrame:
        if self._events is None:
            self._events = events_frame(self._procs)
        return self._events

    @property
    def steps(self) -> pd.DataFrame:
        if self._steps is None:
            self._steps = steps_frame(self.events)
        return self._steps

    @property
    def system(self) -> pd.DataFrame:
        """System metrics, long format (see stepscope.analysis.system)."""
        if self._system is None:
            from stepscope.analysis.system import system_frame

            self._system = system_frame(self.events)
        return self._system

    @property
    def notes(self) -> list:
        """What could not be measured in this run, and why."""
        return list(self.info.get("notes", []))

    @property
    def processes(self) -> pd.DataFrame:
        rows = []
        for p in self._procs:
            c = p.columns
            rows.append({
                "process": os.path.basename(p.folder), "pid": p.meta.get("pid"),
                "host": p.meta.get("host"), "rank": p.meta.get("rank"),
                "origin": p.meta.get("origin"), "parent": p.meta.get("parent"),
                "events": 0 if c is None else len(c["start"]),
                "dropped": p.dropped, "clean_close": bool(c and c["clean_close"]),
                "readable": c is not None,
            })
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        return f"<stepscope.Run {self.path!r}: {len(self._procs)} process(es)>"


def load(run, quiet: bool = False) -> Run:
    """Loads a run folder (or a run name under STEPSCOPE_DIR)."""
    return Run(run, quiet=quiet)
