"""Decodes a run folder's process traces into the events table. Reads only the on-disk format.

Damage never stops a load: an unreadable process folder or a bad chunk is a
warning (naming the file, and the byte offset for chunks), and everything
readable is kept.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import pandas as pd

from stepscope.analysis.store.stacks import lost_samples
from stepscope.core import decoding, metadata
from stepscope.core.vocabulary import (CATEGORIES, DEFAULT_DIR, EVENT_KINDS, MAX_CATEGORIES, PROCESS_JSON,
                                       TRACE_FILE)

KINDS = EVENT_KINDS

# Categories 0-15 exist on disk; names beyond the known ones keep their number.
_CATEGORY_NAMES = list(CATEGORIES) + [f"cat{i}" for i in range(len(CATEGORIES), MAX_CATEGORIES)]



class RunFormatError(ValueError):
    """A path that is not a stepscope run or trace."""


@dataclass
class ProcessTrace:
    """One process folder decoded: columns plus what the reader noticed.

    The columns are released (``release()``) once the events table is built;
    the counts stay."""

    folder: str
    meta: dict
    columns: Optional[dict]
    warnings: List[str] = field(default_factory=list)
    readable: bool = True
    events: int = 0
    dropped: int = 0
    clean_close: bool = False
    lost_samples: int = 0  # Python stack samples whose stacks were lost to damage

    def __post_init__(self):
        c = self.columns
        self.readable = c is not None
        if c is not None:
            self.events = len(c["start"])
            self.dropped = int(c["dropped"])
            self.clean_close = bool(c["clean_close"])

    def release(self) -> None:
        self.columns = None


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


def read_process(folder: str, part: int = 0, parts: int = 1, part_bytes: int = 0, events: bool = True,
                 gpu: bool = True) -> ProcessTrace:
    """One process folder decoded (``parts`` > 1: only the ``part``-th group of its event
    and GPU chunks; ``part_bytes`` > 0 instead: the chunks that start in the
    ``part``-th ``part_bytes`` of the file; everything else comes with every part, and
    so do warnings about the file's structure; a damaged chunk is named by the part that
    decodes it). ``events``/``gpu`` False: the part's event or GPU chunks are skipped."""
    meta_path = os.path.join(folder, PROCESS_JSON)
    meta, notes = metadata.read(meta_path, metadata.PROCESS_FIELDS)
    if not os.path.exists(meta_path):
        notes.append(f"{meta_path}: missing; using the trace header")
    trace = os.path.join(folder, meta.get("trace", TRACE_FILE))
    try:
        cols = decoding.read_trace(trace, part, parts, part_bytes, events=events, gpu=gpu)
    except (ValueError, OSError) as exc:
        notes.append(str(exc))
        return ProcessTrace(folder, meta, None, notes)
    notes.extend(cols["warnings"])
    lost = lost_samples(cols.get("py"))
    if lost:
        notes.append(f"{trace}: {lost} Python stack sample(s) dropped: their stacks were lost to damage")
    try:
        header, bad = metadata.conform(json.loads(bytes(cols["header"]).decode(errors="replace") or "{}"),
                                       metadata.PROCESS_FIELDS, f"{trace} (header)")
        notes.extend(bad)
    except (ValueError, RecursionError):
        header = {}
        notes.append(f"{trace}: unreadable header metadata")
    for key, value in header.items():
        meta.setdefault(key, value)
    if "clock" in header:
        meta["clock"] = header["clock"]
    proc = ProcessTrace(folder, meta, cols, notes)
    proc.lost_samples = lost
    return proc


PROGRESS_BYTES = 64 << 20  # show a progress bar when decoding more than this


def process_folders(run_path: str) -> List[str]:
    """The run's process folders (those with a trace or a process.json), sorted; a
    helper's that holds nothing (``left_empty``) is not one."""
    return sorted(
        os.path.join(run_path, d) for d in os.listdir(run_path)
        if os.path.isdir(os.path.join(run_path, d))
        and (os.path.exists(os.path.join(run_path, d, TRACE_FILE))
             or os.path.exists(os.path.join(run_path, d, PROCESS_JSON)))
        and not left_empty(os.path.join(run_path, d)))


_FILE_HEADER = 16  # magic[8], major, minor, json_len (docs/format.md)


def left_empty(folder: str) -> bool:
    """A helper process (a forked or spawned worker, no rank) that ended before writing
    a single chunk (``os._exit`` before its first flush): its trace is at most the file
    header. Such a folder is skipped silently, like the folder a helper that recorded
    nothing removes when it stops normally. A rank's folder is never skipped: a rank
    killed before its first flush is a finding."""
    try:
        with open(os.path.join(folder, PROCESS_JSON)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict) or meta.get("origin") not in ("fork", "spawn") or meta.get("rank") is not None:
        return False
    try:
        with open(os.path.join(folder, str(meta.get("trace") or TRACE_FILE)), "rb") as f:
            head = f.read(_FILE_HEADER)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return True  # killed between its process.json and its trace
    except OSError:
        return False
    if len(head) < _FILE_HEADER:
        return True
    json_len = int.from_bytes(head[12:16], "little")
    return size <= _FILE_HEADER + json_len


def read_processes(run_path: str) -> List[ProcessTrace]:
    folders = process_folders(run_path)
    sizes = [os.path.getsize(os.path.join(f, TRACE_FILE)) if os.path.exists(os.path.join(f, TRACE_FILE)) else 0
             for f in folders]
    if sum(sizes) < PROGRESS_BYTES or not sys.stderr.isatty():
        return [read_process(f) for f in folders]
    from tqdm import tqdm

    out = []
    with tqdm(total=sum(sizes), unit="B", unit_scale=True, desc="stepscope: reading traces", leave=False) as bar:
        for folder, size in zip(folders, sizes):
            out.append(read_process(folder))
            bar.update(size)
    return out


def names_with_placeholders(names: list, codes: np.ndarray):
    """(names, codes) where every code has a name: an id no NAMES chunk defined (one lost
    to damage, or never written) reads as a placeholder ``<name N>``, one per distinct
    such id, so the list grows with the ids used, never with how large an id is."""
    if not len(codes) or int(codes.max()) < len(names):
        return names, codes
    codes = codes.astype(np.int64)
    missing = codes >= len(names)
    undefined, where = np.unique(codes[missing], return_inverse=True)
    codes[missing] = len(names) + where
    return names + [f"<name {i}>" for i in undefined], codes


def wall_offset(meta: dict) -> int:
    """What turns a process's CLOCK_MONOTONIC ns into wall-clock (epoch) ns: its anchor,
    plus the correction to the reference host's clock that ``stepscope merge`` wrote."""
    clock = meta.get("clock") or {}
    return (int(clock.get("realtime_ns", 0)) - int(clock.get("monotonic_ns", 0))
            + int(meta.get("clock_correction_ns") or 0))


def start_order(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Order by start time, longer spans first where starts are equal (parents before
    children). Files are nearly in start order already, where a stable sort is fast."""
    order = np.argsort(start, kind="stable")
    ss, dur = start[order], (end - start)[order]
    # Only spans starting on the same nanosecond need the longer one first (an
    # instant beside a span has no nesting to keep).
    ties = np.flatnonzero((ss[1:] == ss[:-1]) & (dur[1:] > 0) & (dur[:-1] > 0))
    if len(ties):
        mark = np.zeros(len(order), dtype=bool)
        mark[ties] = True
        mark[ties + 1] = True
        at = np.flatnonzero(mark)
        sub = order[at]
        order[at] = sub[np.lexsort((start[sub] - end[sub], start[sub]))]
    return order


def events_frame(procs: List[ProcessTrace]) -> pd.DataFrame:
    """All events of all processes, wall-clock (epoch ns) times, each process's events
    sorted by start time (parents before children).

    Memory: the output columns are allocated once at their final size and each
    process's decoded columns are dropped as soon as they are copied, so the peak
    stays near one copy of the run rather than three."""
    live = [p for p in procs if p.columns is not None and len(p.columns["start"])]
    if not live:
        return empty_events()
    total = sum(len(p.columns["start"]) for p in live)
    out = {k: np.empty(total, dtype=t) for k, t in (
        ("process", np.int32), ("host", np.int32), ("pid", np.int32), ("rank", np.int32), ("rank_na", bool),
        ("tid", np.int64), ("kind", np.int8), ("category", np.int8), ("name", np.int32),
        ("start_ns", np.int64), ("end_ns", np.int64), ("step", np.int32), ("arg", np.int64),
        ("value", np.float64))}
    processes, hosts, name_ids = [], [], {}
    at = 0
    for p in live:
        c = p.columns
        n = len(c["start"])
        here = slice(at, at + n)
        offset = wall_offset(p.meta)
        np.add(c["start"], offset, out=c["start"])
        np.add(c["end"], offset, out=c["end"])
        order = start_order(c["start"], c["end"])
        # Map this process's name ids onto the run-wide name list.
        local, codes = names_with_placeholders(list(c["names"]), c.pop("name"))
        remap = np.array([name_ids.setdefault(nm, len(name_ids)) for nm in local], dtype=np.int32)
        np.take(remap, codes[order], out=out["name"][here])
        del codes
        rank = p.meta.get("rank") if p.meta.get("rank") is not None else p.meta.get("parent_rank")
        host = str(p.meta.get("host", ""))
        if host not in hosts:
            hosts.append(host)
        processes.append(os.path.basename(p.folder))
        out["process"][here] = len(processes) - 1
        out["host"][here] = hosts.index(host)
        out["pid"][here] = int(p.meta.get("pid", -1))
        out["rank"][here] = -1 if rank is None else int(rank)
        out["rank_na"][here] = rank is None
        for src, dst in (("track", "tid"), ("kind", "kind"), ("category", "category"), ("start", "start_ns"),
                         ("end", "end_ns"), ("step", "step"), ("arg", "arg"), ("value", "value")):
            col, into = c.pop(src), out[dst][here]  # pop: the decoded column goes at once
            np.take(col.view(into.dtype) if col.dtype.itemsize == into.dtype.itemsize else col, order, out=into)
        p.release()
        at += n
    names = sorted(name_ids, key=name_ids.get)
    return pd.DataFrame({
        "process": pd.Categorical.from_codes(out.pop("process"), processes),
        "pid": out.pop("pid"),
        "host": pd.Categorical.from_codes(out.pop("host"), hosts),
        "rank": pd.arrays.IntegerArray(out.pop("rank"), out.pop("rank_na")),
        "tid": out.pop("tid"),
        "kind": pd.Categorical.from_codes(out.pop("kind"), KINDS),
        "category": pd.Categorical.from_codes(out.pop("category"), _CATEGORY_NAMES),
        "name": pd.Categorical.from_codes(out.pop("name"), names),
        "start_ns": out["start_ns"],
        "end_ns": out["end_ns"],
        "duration_ns": out["end_ns"] - out["start_ns"],
        "step": out.pop("step"),
        "arg": out.pop("arg"),
        "value": out.pop("value"),
    }, copy=False)


def empty_events() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
        ("process", "category"), ("pid", "int32"), ("host", "category"), ("rank", "Int32"),
        ("tid", "int64"), ("kind", "category"), ("category", "category"), ("name", "category"),
        ("start_ns", "int64"), ("end_ns", "int64"), ("duration_ns", "int64"), ("step", "int32"),
        ("arg", "int64"), ("value", "float64")]})
