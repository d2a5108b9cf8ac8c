"""Communication: the collectives of a run, per step, and who waited for whom.

From the ``comm`` events (docs/format.md, "Collectives"):

* ``collectives(events)``: one row per collective a process issued: its kind, group,
  number in the group, bytes, and three times: ``start_ns`` (the call), ``issued_ns``
  (the call returned) and ``end_ns`` (completed: an async collective's completion, else
  the call's return).
* ``waits(events, collectives)``: the times each process was blocked on communication:
  ``Work.wait``, DDP's wait for its last bucket at the end of backward, and every
  synchronous collective's call.
* ``step_columns(steps, events)``: per step, ``comm_ns`` (the time any collective of the
  process was in flight), ``comm_exposed_ns`` (of it, the time the process was blocked
  on it) and ``comm_overlapped_ns`` (the rest: communication hidden behind work), so
  exposed + overlapped = communication.
* ``arrivals(collectives)``: each collective matched across the ranks of its group (by
  group and number): the rank that arrived last, and for every other rank the time it
  was blocked waiting for that arrival.

Times are the run's aligned wall clock (ns), so ranks on several hosts compare.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.store.frames import as_strings
from stepscope.core.vocabulary import (COMM_ASYNC, COMM_DDP, COMM_DONE, COMM_LAST_BUCKET, COMM_SEQ_BITS, COMM_WAIT)

STEP_COMM_COLUMNS = ("comm_ns", "comm_exposed_ns", "comm_overlapped_ns")
COLUMNS = ("process", "rank", "pid", "tid", "kind", "group", "seq", "bytes", "is_async", "ddp", "start_ns",
           "issued_ns", "end_ns", "duration_ns")
_SEQ_MASK = (1 << COMM_SEQ_BITS) - 1


def _empty(columns) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})


def comm_events(events: pd.DataFrame) -> pd.DataFrame:
    if "comm" not in events["category"].cat.categories:
        return events.iloc[:0]
    return events[(events["category"] == "comm").to_numpy()]


def collectives(events: pd.DataFrame) -> pd.DataFrame:
    """One row per collective (``COLUMNS``), in start order; ``events``: a run's comm events
    (others are ignored)."""
    ev = comm_events(events)
    if not len(ev):
        out = _empty(COLUMNS)
        for c in ("process", "kind", "group"):
            out[c] = out[c].astype(object)
        return out
    names = ev["name"].astype(str).to_numpy()
    kinds = ev["kind"].astype(str).to_numpy()
    arg = ev["arg"].to_numpy()
    flags = arg >> COMM_SEQ_BITS
    seq = arg & _SEQ_MASK
    not_wait = names != COMM_WAIT
    proc = ev["process"].astype(str).to_numpy()
    key = pd.MultiIndex.from_arrays([proc, names, seq])
    spans = not_wait & (kinds == "span")
    issue = spans & ((flags & COMM_DONE) == 0)
    done = spans & ((flags & COMM_DONE) != 0)
    sizes = not_wait & (kinds == "counter")
    rows = np.flatnonzero(issue)
    out = pd.DataFrame({
        "process": proc[rows], "rank": ev["rank"].to_numpy()[rows], "pid": ev["pid"].to_numpy()[rows],
        "tid": ev["tid"].to_numpy()[rows],
        "kind": [n.partition("@")[0] for n in names[rows]], "group": [n.partition("@")[2] for n in names[rows]],
        "seq": seq[rows].astype(np.int64), "bytes": np.zeros(len(rows), dtype=np.int64),
        "is_async": (flags[rows] & COMM_ASYNC) != 0, "ddp": (flags[rows] & COMM_DDP) != 0,
        "last_bucket": (flags[rows] & COMM_LAST_BUCKET) != 0,
        "start_ns": ev["start_ns"].to_numpy()[rows], "issued_ns": ev["end_ns"].to_numpy()[rows]})
    here = key[rows]
    if sizes.any():
        found = pd.Series(ev["value"].to_numpy()[sizes], index=key[sizes])
        found = found[~found.index.duplicated()]
        out["bytes"] = found.reindex(here).fillna(0).to_numpy().astype(np.int64)
    out["end_ns"] = out["issued_ns"].to_numpy()
    if done.any():
        ends = pd.Series(ev["end_ns"].to_numpy()[done], index=key[done])
        ends = ends[~ends.index.duplicated()]
        completed = ends.reindex(here).to_numpy()
        has = ~np.isnan(completed)
        out.loc[has, "end_ns"] = np.maximum(completed[has].astype(np.int64), out["issued_ns"].to_numpy()[has])
    out["duration_ns"] = out["end_ns"] - out["start_ns"]
    return out.sort_values("start_ns", kind="stable").reset_index(drop=True)


def waits(events: pd.DataFrame, colls: pd.DataFrame) -> pd.DataFrame:
    """(process, start_ns, end_ns): the times a process was blocked on communication."""
    ev = comm_events(events)
    w = ev[(ev["name"].astype(str) == COMM_WAIT).to_numpy() & (ev["kind"].astype(str) == "span").to_numpy()]
    sync = colls[~colls["is_async"].to_numpy()] if len(colls) else colls
    return pd.DataFrame({
        "process": np.concatenate([w["process"].astype(str).to_numpy(), sync["process"].to_numpy().astype(str)]),
        "start_ns": np.concatenate([w["start_ns"].to_numpy(), sync["start_ns"].to_numpy()]).astype(np.int64),
        "end_ns": np.concatenate([w["end_ns"].to_numpy(), sync["issued_ns"].to_numpy()]).astype(np.int64)})


# --- interval arithmetic: disjoint sorted intervals as (starts, ends) ------------------------
def union(starts: np.ndarray, ends: np.ndarray):
    if not len(starts):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum(ends[order], starts[order])
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:] - 1, len(s) - 1)
    return s[firsts], reach[lasts]


def intersect(a, b):
    """The intersection of two unions (each disjoint and sorted), over the elementary
    segments between all their ends."""
    (as_, ae), (bs, be) = a, b
    if not len(as_) or not len(bs):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    x = np.unique(np.concatenate([as_, ae, bs, be]))
    lo, hi = x[:-1], x[1:]
    inside = ((np.searchsorted(as_, lo, "right") > np.searchsorted(ae, lo, "right"))
              & (np.searchsorted(bs, lo, "right") > np.searchsorted(be, lo, "right")))
    s, e = lo[inside], hi[inside]
    if not len(s):
        return s.astype(np.int64), e.astype(np.int64)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] != e[:-1]  # touching segments are one interval
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:] - 1, len(s) - 1)
    return s[firsts].astype(np.int64), e[lasts].astype(np.int64)


def measure(intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The length of a union inside each window [lo, hi)."""
    s, e = intervals
    if not len(s):
        return np.zeros(len(lo), dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(e - s)])

    def before(t):  # length of the union before t
        i = np.searchsorted(s, t, side="right") - 1
        inside = np.where(i >= 0, np.clip(t - s[np.maximum(i, 0)], 0, (e - s)[np.maximum(i, 0)]), 0)
        return cum[np.maximum(i, 0)] * (i >= 0) + inside

    return np.maximum(before(hi) - before(lo), 0).astype(np.int64)


def step_columns(steps: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with ``STEP_COMM_COLUMNS`` (zeros in a run without collectives)."""
    for c in STEP_COMM_COLUMNS:
        steps[c] = np.zeros(len(steps), dtype=np.int64)
    if not len(steps):
        return steps
    colls = collectives(events)
    if not len(colls):
        return steps
    blocked = waits(events, colls)
    step_proc = steps["process"].astype(str).to_numpy()
    lo, hi = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    total, exposed = np.zeros(len(steps), np.int64), np.zeros(len(steps), np.int64)
    for proc, c in colls.groupby("process", sort=False):
        rows = np.flatnonzero(step_proc == proc)
        if not len(rows):
            continue
        inflight = union(c["start_ns"].to_numpy(), c["end_ns"].to_numpy())
        w = blocked[blocked["process"].to_numpy() == proc]
        hidden = intersect(inflight, union(w["start_ns"].to_numpy(), w["end_ns"].to_numpy()))
        total[rows] = measure(inflight, lo[rows], hi[rows])
        exposed[rows] = measure(hidden, lo[rows], hi[rows])
    steps["comm_ns"], steps["comm_exposed_ns"], steps["comm_overlapped_ns"] = total, exposed, total - exposed
    return steps


def arrivals(colls: pd.DataFrame, blocked: pd.DataFrame) -> pd.DataFrame:
    """Per (collective, rank) of a group with 2 ranks or more: ``last_rank`` (the rank
    that arrived last: the latest start), ``late_ns`` (how much later it came) and
    ``waited_ns``: the part of [this rank's arrival, the last arrival] this rank spent
    blocked on communication (what the last rank cost it)."""
    keep = ["group", "seq", "kind", "rank", "process", "start_ns"] + (["step"] if "step" in colls else [])
    cols = keep + ["last_rank", "late_ns", "waited_ns"]
    c = colls[colls["rank"].notna()] if len(colls) else colls
    if not len(c) or c["rank"].nunique() < 2:
        return pd.DataFrame({k: [] for k in cols})
    c = c[keep].copy()
    c["rank"] = c["rank"].astype(np.int64)
    g = c.groupby(["group", "seq"], sort=False)["start_ns"]
    c["last_start"] = g.transform("max")
    c = c[g.transform("size").to_numpy() > 1]
    idx = c.groupby(["group", "seq"], sort=False)["start_ns"].idxmax()
    last = c.loc[idx, ["group", "seq", "rank"]].rename(columns={"rank": "last_rank"})
    c = c.merge(last, on=["group", "seq"], how="left")
    c["late_ns"] = c["last_start"] - c["start_ns"]
    c["waited_ns"] = 0
    for proc, rows in c.groupby("process", sort=False).indices.items():
        w = blocked[blocked["process"].to_numpy() == proc]
        if not len(w):
            continue
        u = union(w["start_ns"].to_numpy(), w["end_ns"].to_numpy())
        lo = c["start_ns"].to_numpy()[rows]
        hi = c["last_start"].to_numpy()[rows]
        c.loc[c.index[rows], "waited_ns"] = measure(u, lo, np.maximum(hi, lo))
    c.loc[c["rank"] == c["last_rank"], "waited_ns"] = 0
    return c[cols]


def waited_for(arr: pd.DataFrame, blocked: pd.DataFrame) -> pd.DataFrame:
    """Per rank that arrived last at a collective: ``last_at`` (how many), and
    ``waited_ns``: the time the other ranks were blocked waiting for it. A rank blocked
    once for several collectives (DDP's buckets, all awaited at the end of backward)
    counts that time once: the union, per rank it waited for."""
    cols = ["rank", "last_at", "waited_ns"]
    if not len(arr):
        return pd.DataFrame({k: pd.Series(dtype="int64") for k in cols})
    waited = {}
    late = arr[arr["rank"] != arr["last_rank"]]
    for (proc, last), rows in late.groupby(["process", "last_rank"], sort=False).indices.items():
        w = blocked[blocked["process"].to_numpy() == proc]
        if not len(w):
            continue
        lo = late["start_ns"].to_numpy()[rows]
        behind = union(lo, np.maximum(lo + late["late_ns"].to_numpy()[rows], lo))
        both = intersect(behind, union(w["start_ns"].to_numpy(), w["end_ns"].to_numpy()))
        waited[int(last)] = waited.get(int(last), 0) + int((both[1] - both[0]).sum())
    last_at = arr[arr["rank"] == arr["last_rank"]].groupby("last_rank").size()
    res = pd.DataFrame({"rank": last_at.index.astype(np.int64), "last_at": last_at.to_numpy().astype(np.int64)})
    res["waited_ns"] = [waited.get(int(r), 0) for r in res["rank"]]
    return res.sort_values("waited_ns", ascending=False, kind="stable").reset_index(drop=True)[cols]


def waits_by_step(arr: pd.DataFrame, blocked: pd.DataFrame) -> pd.DataFrame:
    """``waited_for`` per step: one row per (waiting rank, rank it waited for, step of the
    waiting rank) with ``waited_ns``, the time it was blocked behind that rank's late
    arrivals in that step (overlapping waits counted once). ``arr`` needs its ``step``.
    Vectorized: the windows of each (process, rank, last rank, step) merged in one sorted
    pass, then one ``measure`` per process (a long run has millions of collectives)."""
    cols = ["rank", "last_rank", "step", "waited_ns"]
    late = arr[(arr["rank"] != arr["last_rank"]) & (arr["late_ns"] > 0)] if len(arr) else arr
    if not len(late):
        return pd.DataFrame({k: pd.Series(dtype="int64") for k in cols})
    keys = ["process", "rank", "last_rank", "step"]
    w = pd.DataFrame({"process": as_strings(late["process"]), "rank": late["rank"].to_numpy(np.int64),
                      "last_rank": late["last_rank"].to_numpy(np.int64), "step": late["step"].to_numpy(np.int64),
                      "lo": late["start_ns"].to_numpy(np.int64)})
    w["hi"] = w["lo"] + late["late_ns"].to_numpy(np.int64)
    w = w.sort_values(keys + ["lo"], kind="stable").reset_index(drop=True)
    reach = w.groupby(keys, sort=False)["hi"].cummax()
    before = reach.groupby([w[k] for k in keys], sort=False).shift()
    w["interval"] = (before.isna() | (w["lo"] > before)).cumsum()
    merged = w.groupby("interval", sort=False).agg(process=("process", "first"), rank=("rank", "first"),
                                                 last_rank=("last_rank", "first"), step=("step", "first"),
                                                 lo=("lo", "first"))
    merged["hi"] = reach.groupby(w["interval"], sort=False).max().to_numpy()
    merged["waited_ns"] = 0
    for proc, idx in merged.groupby("process", sort=False).indices.items():
        b = blocked[as_strings(blocked["process"]) == proc]
        if len(b):
            u = union(b["start_ns"].to_numpy(np.int64), b["end_ns"].to_numpy(np.int64))
            merged.iloc[idx, merged.columns.get_loc("waited_ns")] = measure(
                u, merged["lo"].to_numpy()[idx], merged["hi"].to_numpy()[idx])
    out = merged.groupby(["rank", "last_rank", "step"], sort=True)["waited_ns"].sum().reset_index()
    return out[cols].astype("int64")

