"""The steps and phases tables through the native pass (csrc/aggregate/step_phases.cc).

``stepping.py`` defines both tables; this computes the same with one native pass
per process over the events table's columns (no per-record Python, no pandas
group-bys), and builds the DataFrames exactly as ``stepping.py`` does around it.
``tests/test_step_pass.py`` holds the two to equality on every corpus run.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import pandas as pd

from stepscope.analysis.store.frames import without_unused
from stepscope.analysis.store.schema import PHASE_COLUMNS, STEP_PHASE_COLUMNS
from stepscope.core import decoding
from stepscope.core.vocabulary import END_MARK, INTERRUPTED, PHASES, TORCH_OP_WINDOW_SPANS


# the events' columns a phase row copies
_PHASE_SOURCES = ("process", "pid", "rank", "tid", "name", "start_ns", "end_ns", "duration_ns")


def _code(categorical, value) -> int:
    cats = categorical.categories
    return int(cats.get_loc(value)) if value in cats else -1


def _taken(column: pd.Series, rows: np.ndarray, unused: bool = True) -> pd.Categorical:
    """``column.iloc[rows]`` of a categorical as an array (``unused`` False: its unused
    categories dropped, as ``remove_unused_categories`` does)."""
    out = pd.Categorical.from_codes(column.cat.codes.to_numpy()[rows], dtype=column.dtype)
    return out if unused else without_unused(out)


def _blocks(process_codes: np.ndarray):
    """(lo, hi) of each process's rows: the events table keeps a process's events together."""
    if not len(process_codes):
        return []
    cuts = np.flatnonzero(process_codes[1:] != process_codes[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(process_codes)]
    return list(zip(bounds[:-1], bounds[1:]))


def steps_and_phases(events: pd.DataFrame, consume: bool = False) -> Optional[Tuple[pd.DataFrame, pd.DataFrame]]:
    """(steps, phases) as ``stepping.steps_and_phases`` makes them, or None where the
    native pass does not apply (no steps, or a table whose processes are not in blocks).
    ``consume``: where it applies, the columns of ``events`` are dropped once read."""
    if not len(events):
        return None
    process = events["process"].cat.codes.to_numpy()
    if np.any(process[1:] < process[:-1]):
        return None
    kind, cat, name = events["kind"].cat, events["category"].cat, events["name"].cat
    names = name.categories
    phase_of_name = np.full(len(names), -1, dtype=np.int8)
    for i, p in enumerate(PHASES):
        if p in names:
            phase_of_name[names.get_loc(p)] = i
    op_window = np.zeros(len(names), dtype=np.uint8)
    for w in TORCH_OP_WINDOW_SPANS:
        if w in names:
            op_window[names.get_loc(w)] = 1
    columns = {
        "kind": kind.codes.to_numpy().astype(np.int8, copy=False),
        "category": cat.codes.to_numpy().astype(np.int8, copy=False),
        "name": name.codes.to_numpy().astype(np.int32, copy=False),
        "tid": events["tid"].to_numpy(np.int64), "start": events["start_ns"].to_numpy(np.int64),
        "end": events["end_ns"].to_numpy(np.int64), "arg": events["arg"].to_numpy(np.int64)}
    codes = dict(phase_of_name=phase_of_name, op_window_name=op_window,
                 kind_instant=_code(kind, "instant"), kind_span=_code(kind, "span"), cat_step=_code(cat, "step"),
                 cat_phase=_code(cat, "phase"), cat_framework=_code(cat, "framework"),
                 end_mark=_code(name, END_MARK), interrupted=_code(name, INTERRUPTED))
    parts, at, flags = [], 0, 0
    for lo, hi in _blocks(process):
        r = decoding.step_phases(**{k: v[lo:hi] for k, v in columns.items()}, **codes)
        r["step_row"] += lo
        r["phase_row"] += lo
        r["phase_step"][r["phase_step"] >= 0] += at
        at += len(r["step_row"])
        flags += r["interrupt_marks"]
        parts.append(r)
    if not at:
        return None
    del columns

    def give_up(*names):  # the events' columns read for the last time
        for c in names if consume else ():
            del events[c]

    def join(key):  # a result column of every process (given up by the parts: one copy held, not two)
        pieces = [r.pop(key) for r in parts]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    rows = join("step_row")
    steps = pd.DataFrame({
        "process": pd.Categorical.from_codes(process[rows], events["process"].cat.categories),
        "pid": events["pid"].to_numpy()[rows],
        "rank": events["rank"].array[rows].astype("Int64"),
        "tid": join("step_tid"),
        "mode": _taken(events["name"], rows, unused=False),
        "step": events["arg"].to_numpy()[rows],
        "start_ns": join("step_start"), "end_ns": join("step_end")})
    steps["duration_ns"] = steps["end_ns"] - steps["start_ns"]
    if flags:  # as stepping._flag_interrupted leaves it
        mode = steps["mode"].astype(object).to_numpy().copy()
        mode[join("step_interrupted").astype(bool)] = INTERRUPTED
        steps["mode"] = pd.Categorical(mode)
    for i, p in enumerate(PHASES):
        steps[p] = np.concatenate([r["phase_sums"][i] for r in parts]) if len(parts) > 1 else parts[0]["phase_sums"][i]
    steps["Other"] = join("other")
    give_up(*(c for c in events.columns if c not in _PHASE_SOURCES))
    rows = join("phase_row")
    if not len(rows):
        return steps[STEP_PHASE_COLUMNS], pd.DataFrame({c: [] for c in PHASE_COLUMNS})
    # a column at a time, its temporaries gone before the next (a long run has millions of phases)
    labels = join("phase_step")
    missing = labels < 0
    labels[missing] = 0  # (the native pass's own array)
    step_mode = steps["mode"].astype("category")
    mode_codes = step_mode.cat.codes.to_numpy()[labels]
    mode_codes[missing] = -1
    step = steps["step"].to_numpy().astype(np.int32)[labels]
    step[missing] = -1
    del labels, missing
    phases = {"mode": pd.Categorical.from_codes(mode_codes, step_mode.cat.categories), "step": step}
    del mode_codes, step
    phases["process"] = _taken(events["process"], rows)
    phases["name"] = _taken(events["name"], rows, unused=False)
    give_up("process", "name")
    phases["rank"] = events["rank"].array[rows]
    for c in ("pid", "tid", "start_ns", "end_ns", "duration_ns"):
        phases[c] = events[c].to_numpy()[rows]
        give_up(c)
    give_up("rank")
    del rows
    phases["exclusive_ns"] = join("phase_exclusive")
    return steps[STEP_PHASE_COLUMNS], pd.DataFrame(phases, copy=False)[PHASE_COLUMNS]
