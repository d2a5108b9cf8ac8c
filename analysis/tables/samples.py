"""Python stack samples (``csrc/record/pysampler.cc``, format 1.2) as tables (plain functions over DataFrames).

* ``stacks``: one row per distinct stack of the run (stacks of every process
  interned together): ``stack``, ``parent`` (-1 at the root), ``depth`` and its
  leaf frame's ``function``, ``file``, ``line``. A stack is its parent plus one frame.
* ``samples``: one row per sample: process, pid, rank, tid, thread (its name, as
  the process recorded it at its end; empty for a thread gone by then), time_ns (epoch ns),
  interval_ns (the sampling interval: what one sample stands for), stack, the
  leaf's function/file/line, and the step, mode and phase it fell in. The step
  is found by time (per thread where loops ran in several threads); the phase
  is the innermost phase *of the sample's own thread* that contains it, Other
  when the thread is its step's loop thread but in no phase, else None (a
  helper thread: pick the loop's thread with ``tid``).
* ``by_function``: per phase and function, self samples (the function is the
  leaf) and total samples (the function is anywhere on the stack, counted once
  per sample under recursion), and the time they stand for (samples x interval).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from stepscope.analysis.store.schema import SAMPLE_COLUMNS
from stepscope.analysis.tables.stepping import attribute_to_steps
from stepscope.core.vocabulary import OTHER

FUNCTION_COLUMNS = ["phase", "function", "file", "self_samples", "total_samples", "self_s", "total_s",
                    "self_share", "total_share"]


def _innermost(starts: np.ndarray, ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each time, the index of the innermost span (of one thread) containing it, or -1.
    Spans nest or follow each other (phases of one thread); sorted by start, parents first."""
    order = np.lexsort((starts - ends, starts))
    s, e = starts[order], ends[order]
    parent = np.full(len(s), -1, dtype=np.int64)
    if np.any(s[1:] < np.maximum.accumulate(e)[:-1]):  # nesting: each span's enclosing span
        stack: List[int] = []
        for i in range(len(s)):
            while stack and s[i] >= e[stack[-1]]:
                stack.pop()
            parent[i] = stack[-1] if stack else -1
            stack.append(i)
    cand = np.searchsorted(s, times, side="right") - 1
    out = np.full(len(times), -1, dtype=np.int64)
    for _ in range(64):  # climb to an enclosing span where the last one to start has ended
        live = cand >= 0
        if not live.any():
            break
        inside = live & (times < e[np.maximum(cand, 0)])
        out[inside] = cand[inside]
        cand = np.where(live & ~inside, parent[np.maximum(cand, 0)], -1)
    return np.where(out >= 0, order[np.maximum(out, 0)], -1)


def samples_frame(raw: pd.DataFrame, stacks: pd.DataFrame, steps: pd.DataFrame,
                  phases: pd.DataFrame) -> pd.DataFrame:
    """The samples table: raw samples with their leaf frame, step, mode and phase."""

    n = len(raw)
    stack = raw["stack"].to_numpy()
    out = pd.DataFrame({
        "process": raw["process"], "pid": raw["pid"].to_numpy(), "rank": raw["rank"],
        "tid": raw["tid"].to_numpy(), "thread": raw["thread"] if "thread" in raw else "",
        "time_ns": raw["time_ns"].to_numpy(),
        "interval_ns": raw["interval_ns"].to_numpy(), "stack": stack,
        "function": pd.Categorical(stacks["function"].to_numpy()[stack]) if n else pd.Categorical([]),
        "file": pd.Categorical(stacks["file"].to_numpy()[stack]) if n else pd.Categorical([]),
        "line": stacks["line"].to_numpy()[stack] if n else np.empty(0, dtype=np.int64)})
    step = np.full(n, -1, dtype=np.int64)
    mode = np.full(n, None, dtype=object)
    phase = np.full(n, None, dtype=object)
    if n and len(steps):
        labels = np.full(n, -1, dtype=np.int64)
        times, tids = out["time_ns"].to_numpy(), out["tid"].to_numpy()
        procs = raw["process"].astype(str).to_numpy()
        for proc in np.unique(procs):
            mine = np.flatnonzero(procs == proc)
            sub = np.empty(len(mine), dtype=np.int64)
            attribute_to_steps(steps, proc, times[mine], sub, tids[mine])
            labels[mine] = sub
        has = labels >= 0
        rows = steps.loc[labels[has]]
        step[has] = rows["step"].to_numpy()
        mode[has] = rows["mode"].astype(str).to_numpy()
        # Other: inside a step of the sample's own thread, outside its phases.
        phase[has] = np.where(rows["tid"].to_numpy() == tids[has], OTHER, None)
        if len(phases):
            ph_proc = phases["process"].astype(str).to_numpy()
            ph_tid = phases["tid"].to_numpy()
            names = phases["name"].astype(str).to_numpy()
            for proc, tid in {(a, b) for a, b in zip(procs, tids)}:
                at = np.flatnonzero((ph_proc == proc) & (ph_tid == tid))
                if not len(at):
                    continue
                mine = np.flatnonzero((procs == proc) & (tids == tid))
                idx = _innermost(phases["start_ns"].to_numpy()[at], phases["end_ns"].to_numpy()[at], times[mine])
                hit = idx >= 0
                phase[mine[hit]] = names[at[idx[hit]]]
    out["step"] = step
    out["mode"] = mode
    out["phase"] = phase
    return out[SAMPLE_COLUMNS]


def stack_paths(stacks: pd.DataFrame) -> List[Tuple[int, ...]]:
    """Per stack id, its stack ids from the root to itself (parents come before children)."""
    parents = stacks["parent"].to_numpy()
    paths: List[Tuple[int, ...]] = []
    for i, par in enumerate(parents):
        paths.append((paths[par] if par >= 0 else ()) + (i,))
    return paths


def by_function(samples: pd.DataFrame, stacks: pd.DataFrame) -> pd.DataFrame:
    """Per phase and function (name and file): self and total samples and the time they stand for."""
    if not len(samples):
        return pd.DataFrame({c: [] for c in FUNCTION_COLUMNS})
    phase = samples["phase"].fillna("-")
    counts = (pd.DataFrame({"phase": phase, "stack": samples["stack"], "w": samples["interval_ns"]})
              .groupby(["phase", "stack"], observed=True).agg(n=("w", "size"), ns=("w", "sum")).reset_index())
    paths = stack_paths(stacks)
    func, file = stacks["function"].to_numpy(), stacks["file"].to_numpy()
    keys_of: Dict[int, set] = {}
    rows = []
    for ph, st, n, ns in counts.itertuples(index=False):
        keys = keys_of.get(st)
        if keys is None:  # a function counts once per sample however often it recurs
            keys = keys_of[st] = {(func[s], file[s]) for s in paths[st]}
        rows.extend((ph, f, fl, 0, n, 0, ns) for f, fl in keys)
        rows.append((ph, func[st], file[st], n, 0, ns, 0))
    flat = pd.DataFrame(rows, columns=["phase", "function", "file", "self_samples", "total_samples",
                                       "self_ns", "total_ns"])
    agg = flat.groupby(["phase", "function", "file"], sort=False).sum().reset_index()
    totals = counts.groupby("phase")["n"].sum()
    agg["self_s"] = agg.pop("self_ns") / 1e9
    agg["total_s"] = agg.pop("total_ns") / 1e9
    agg["self_share"] = agg["self_samples"] / agg["phase"].map(totals)
    agg["total_share"] = agg["total_samples"] / agg["phase"].map(totals)
    return agg.sort_values(["phase", "self_samples", "total_samples"], ascending=[True, False, False],
                           ignore_index=True)[FUNCTION_COLUMNS]


def frame_label(function: str, file: str, line: Optional[int] = None) -> str:
    """``function (file:line)``, as py-spy prints frames; no ';' (the folded format's separator)."""
    where = f"{file}:{line}" if line is not None else file
    return f"{function} ({where})".replace(";", ":")


def folded(samples: pd.DataFrame, stacks: pd.DataFrame, by_phase: bool = False,
           lines: bool = True) -> List[str]:
    """Brendan Gregg's folded stacks: ``root;...;leaf count`` per distinct stack, root first;
    ``by_phase`` puts the sample's phase (or ``-``) as the root frame."""
    if not len(samples):
        return []
    keys = ["stack"] + (["phase"] if by_phase else [])
    frame = pd.DataFrame({"stack": samples["stack"].to_numpy()})
    if by_phase:
        frame["phase"] = samples["phase"].fillna("-").to_numpy()
    counts = frame.groupby(keys, sort=True).size()
    paths = stack_paths(stacks)
    func, file, line = stacks["function"].to_numpy(), stacks["file"].to_numpy(), stacks["line"].to_numpy()
    label = [frame_label(func[i], file[i], int(line[i]) if lines else None) for i in range(len(stacks))]
    out = []
    for key, n in counts.items():
        st, ph = (key if by_phase else (key, None))
        parts = ([ph] if by_phase else []) + [label[s] for s in paths[st]]
        out.append(f"{';'.join(parts)} {int(n)}")
    return out


def speedscope(samples: pd.DataFrame, stacks: pd.DataFrame, name: str) -> dict:
    """speedscope's file format: shared frames, one "sampled" profile per process and thread,
    stacks root first, weights in nanoseconds (each sample's interval)."""
    paths = stack_paths(stacks)
    frames: List[dict] = []
    frame_of: Dict[tuple, int] = {}
    func, file, line = stacks["function"].to_numpy(), stacks["file"].to_numpy(), stacks["line"].to_numpy()

    def frame_index(s: int) -> int:
        key = (func[s], file[s], int(line[s]))
        i = frame_of.get(key)
        if i is None:
            i = frame_of[key] = len(frames)
            frames.append({"name": str(func[s]), "file": str(file[s]), "line": int(line[s])})
        return i

    profiles = []
    ordered = samples.sort_values(["process", "tid", "time_ns"], kind="stable")
    for (proc, tid), grp in ordered.groupby(["process", "tid"], observed=True, sort=True):
        idx = {}
        stacks_out = []
        for st in grp["stack"].to_numpy():
            st = int(st)
            if st not in idx:
                idx[st] = [frame_index(s) for s in paths[st]]
            stacks_out.append(idx[st])
        weights = grp["interval_ns"].to_numpy()
        t0 = int(grp["time_ns"].iloc[0])
        thread = str(grp["thread"].iloc[0]) or "thread"
        profiles.append({"type": "sampled", "name": f"{proc} {thread} ({int(tid)})", "unit": "nanoseconds",
                         "startValue": 0, "endValue": int(grp["time_ns"].iloc[-1] - t0 + weights[-1]),
                         "samples": stacks_out, "weights": [int(w) for w in weights]})
    return {"$schema": "https://www.speedscope.app/file-format-schema.json", "shared": {"frames": frames},
            "profiles": profiles, "name": name, "activeProfileIndex": 0, "exporter": "stepscope"}
