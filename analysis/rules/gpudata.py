"""What the GPU rules share: why a run has no GPU data, the train steps they judge,
and busy time as the union of kernel intervals."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis.store.frames import groups, split


def no_gpu_reason(run, need: str) -> Optional[str]:
    """None when the run has the GPU data ``need`` names, else why not.

    need: "metrics" (NVML samples in the system table) or "trace" (CUPTI kernels).
    """
    has = len(samples_of(run, "gpu_util")) > 0 if need == "metrics" else run.rows("kernels") > 0
    if has:
        return None
    if any(" GPU: no NVIDIA driver here" in n or n.startswith("GPU: no NVIDIA driver") for n in run.notes):
        return "no GPU (no NVIDIA driver on the host)"
    if need == "metrics":
        return "no GPU utilization samples (NVML; needs --gpu metrics or trace on a GPU host)"
    return "no GPU kernels (CUPTI activity tracing; needs --gpu trace on a GPU host)"


def samples_of(run, metric: str) -> pd.DataFrame:
    """The system table's rows of one metric, selected once per run (several rules read the
    GPU's utilization or a process's memory; the table holds every sample of a long run).
    Shared between rules: filter it, do not change it."""
    return memo(run, ("samples_of", metric), lambda: run.system[run.system["metric"] == metric])


def train_steps(run, warmup_steps: float) -> pd.DataFrame:
    """Train steps of every process, each process's first warmup_steps left out (a
    shallow copy: columns a rule adds stay its own)."""
    return memo(run, ("train_steps", float(warmup_steps)), lambda: _train_steps(run, warmup_steps)).copy(deep=False)


def train_groups(run) -> list:
    """[((process, rank), train steps)], as ``groupby(["process", "rank"], dropna=False,
    sort=True, observed=True)`` gives them, split once per run (several rules walk them;
    each split copies a run's millions of steps)."""
    def build():
        train = run.steps[run.steps["mode"] == "train"]
        return groups(train, ["process", "rank"])
    return memo(run, "train_groups", build)


def steps_by_process(steps: pd.DataFrame, columns: list) -> dict:
    """{process: its steps' ``columns``}, the rows, order and index of
    ``steps[steps["process"] == process]``, processes in the order they first appear (as
    ``groupby("process", sort=False)``): one split, not a scan of every step per process."""
    return dict(split(steps, "process", columns))


def process_ranks(steps: pd.DataFrame) -> list:
    """The (process, rank) keys of ``steps.groupby(["process", "rank"], dropna=False,
    sort=True, observed=True)``, in its order, without splitting the steps."""
    pairs = steps[["process", "rank"]]
    rank = pairs["rank"].astype("Int64")
    if len(pairs) > 1:
        # only the rows where a run of one pair starts: every pair has one, and a run's
        # millions of steps make a few runs (a process's steps come together)
        process = np.asarray(pd.Categorical(pairs["process"]).codes)
        missing, value = rank.isna().to_numpy(), rank.fillna(0).to_numpy(np.int64)
        changes = (process[1:] != process[:-1]) | (value[1:] != value[:-1]) | (missing[1:] != missing[:-1])
        starts = np.concatenate(([0], np.flatnonzero(changes) + 1))
        pairs, rank = pairs.iloc[starts], rank.iloc[starts]
    if len(pairs) > 4096 and not (rank < 0).any() and not (rank >= 1 << 31).any():
        # a row of each pair, found by a hash of one integer key (a run's millions of steps)
        process = np.asarray(pd.Categorical(pairs["process"]).codes, dtype=np.int64) + 1
        key = (process << 32) | np.where(rank.isna().to_numpy(), 0, rank.fillna(0).to_numpy(np.int64) + 1)
        pairs = pairs.iloc[pd.Series(key).drop_duplicates().index.to_numpy()]
    pairs = pairs.drop_duplicates()
    return [key for key, _ in pairs.groupby(["process", "rank"], dropna=False, sort=True, observed=True)]


def memo(run, key, build):
    """``run.memo(key, build)`` where the run keeps such values (a loaded ``Run``), else ``build()``."""
    keep = getattr(run, "memo", None)
    return keep(key, build) if callable(keep) else build()


def _train_steps(run, warmup_steps: float) -> pd.DataFrame:
    train = run.steps[run.steps["mode"] == "train"]
    if train.empty:
        return train
    train = train.sort_values(["process", "start_ns"], kind="stable")
    order = train.groupby("process", sort=False).cumcount()
    return train[order.to_numpy() >= int(warmup_steps)]


def node_of(run) -> dict:
    """process folder -> host."""
    p = run.processes
    return dict(zip(p["process"], p["host"].astype(str))) if len(p) else {}


def union_busy_ns(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> pd.Series:
    """Per group, the time covered by at least one of its [start, end) intervals
    (kernels of several streams overlap; each instant counts once)."""
    if not len(start):
        return pd.Series(dtype=np.int64)
    order = np.lexsort((start, group))
    g, s, e = group[order], start[order].astype(np.int64), end[order].astype(np.int64)
    frame = pd.DataFrame({"g": g, "s": s, "e": e})
    # the furthest end among earlier intervals of the same group
    reach = frame.groupby("g", sort=False)["e"].cummax().groupby(frame["g"], sort=False).shift(1)
    reach = reach.fillna(np.iinfo(np.int64).min).astype(np.int64).to_numpy()
    covered = np.clip(e - np.maximum(s, reach), 0, None)
    return pd.Series(covered, index=g).groupby(level=0, sort=False).sum()

