"""Per step, the time its process spent compiling or tracing: the steps' ``compile_ns``.

From the framework spans compiling leaves (``core/vocabulary.py``): torch.compile's
compiles, tf.function's traces, JAX's stages as they are, and a tf.function's first run
as its extra time over its second (the runtime's graph set-up and XLA's compile, placed
at the first run's start; a function run once has no figure). ``analysis/compilation.py``
reads the same spans for the summary's block.

* ``spans(events)``: process, start_ns, end_ns of every such time (a frame small enough to
  keep while the steps are built).
* ``per_step(steps, spans)``: per step, the time of their union inside it.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from stepscope.analysis.tables import comm
from stepscope.core.vocabulary import COMPILING_PREFIXES, TF_RUN_PREFIX

# TF_RUN_PREFIX <function>/<id>#<1|2>[ xla]
FIRST_RUN = re.compile(r"^" + re.escape(TF_RUN_PREFIX) + r" (?P<function>.*)/(?P<id>\d+)#(?P<n>[12])(?P<xla> xla)?$")
COLUMNS = ("process", "start_ns", "end_ns")


def _empty() -> pd.DataFrame:
    return pd.DataFrame({"process": pd.Series(dtype=object), "start_ns": pd.Series(dtype=np.int64),
                         "end_ns": pd.Series(dtype=np.int64)})


def compiling_names(names) -> list:
    """The names (of a categorical's categories) that compiling leaves."""
    return [n for n in names if isinstance(n, str) and n.startswith(COMPILING_PREFIXES)]


def first_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Framework spans named ``TF_RUN_PREFIX ...`` (process, name, start_ns, end_ns) ->
    per built function run twice: process, function, xla, and [start_ns, end_ns) its first
    run's extra time over its second (none where that is not longer)."""
    out_columns = ["process", "function", "xla", "start_ns", "end_ns"]
    parsed = runs["name"].astype(str).str.extract(FIRST_RUN)
    runs = pd.concat([runs[["process", "start_ns", "end_ns"]].reset_index(drop=True),
                      parsed.reset_index(drop=True)], axis=1).dropna(subset=["function"])
    if not len(runs):
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("process", "function") else
                                          bool if c == "xla" else np.int64) for c in out_columns})
    runs = runs.assign(process=runs["process"].astype(str), duration=runs["end_ns"] - runs["start_ns"],
                       xla=runs["xla"].notna())
    key = ["process", "function", "id"]
    first = runs[runs["n"] == "1"].drop_duplicates(key).set_index(key)
    second = runs[runs["n"] == "2"].drop_duplicates(key).set_index(key)
    both = first.join(second[["duration"]].rename(columns={"duration": "duration_2"}), how="inner")
    extra = (both["duration"] - both["duration_2"]).clip(lower=0)
    both = both.assign(end_ns=both["start_ns"] + extra)[extra > 0].reset_index()
    return both[out_columns].astype({"start_ns": np.int64, "end_ns": np.int64}).reset_index(drop=True)


def spans(events: pd.DataFrame) -> pd.DataFrame:
    """Every time the run spent compiling or tracing (``COLUMNS``)."""
    if "framework" not in events["category"].cat.categories:
        return _empty()
    names = compiling_names(events["name"].cat.categories)
    if not names:
        return _empty()
    rows = ((events["category"] == "framework") & (events["kind"] == "span") & events["name"].isin(names)).to_numpy()
    found = events.loc[rows, ["process", "name", "start_ns", "end_ns"]]
    runs = found["name"].astype(str).str.startswith(TF_RUN_PREFIX).to_numpy()
    plain = found.loc[~runs, list(COLUMNS)]
    out = pd.concat([plain.assign(process=plain["process"].astype(str)),
                     first_runs(found.loc[runs])[list(COLUMNS)]], ignore_index=True)
    return out.astype({"start_ns": np.int64, "end_ns": np.int64})


def per_step(steps: pd.DataFrame, found: pd.DataFrame) -> np.ndarray:
    """Per step (row of ``steps``), the time a compile of its process ran inside it."""
    out = np.zeros(len(steps), dtype=np.int64)
    if not len(found) or not len(steps):
        return out
    proc = steps["process"].astype(str).to_numpy()
    lo, hi = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    for p, s in found.groupby("process", sort=False):
        rows = np.flatnonzero(proc == str(p))
        if len(rows):
            u = comm.union(s["start_ns"].to_numpy(np.int64), s["end_ns"].to_numpy(np.int64))
            out[rows] = comm.measure(u, lo[rows], hi[rows])
    return out
