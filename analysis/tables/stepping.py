"""Derived tables: steps and phases from the events table (plain functions over DataFrames).

* ``steps``: one row per step (SPEC §3): process, pid, rank, mode, step,
  start_ns, end_ns, duration_ns, the five phases' exclusive time in the
  step, Other (the step's time outside every phase), its communication and
  its loop (``analysis/loops.py``).
* ``phases``: one row per phase span, attributed by time to the step it
  starts in, with its exclusive time (a phase minus the phases nested in it,
  as Forward/Backward inside an LBFGS Optimizer step).
GPU tables (kernels, memcpy, memset, sync, cuda_api) are in ``gpu.py``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis.store.schema import PHASE_COLUMNS, STEP_COMPILE_COLUMN, STEP_LOOP_COLUMN, STEP_PHASE_COLUMNS
from stepscope.analysis.tables import comm, compiling, step_pass
from stepscope.analysis.tables.loop_numbers import loop_numbers
from stepscope.core.vocabulary import END_MARK, INTERRUPTED, LOOP_MARK, PHASES, TORCH_OP_WINDOW_SPANS, VOID_MARK



def _rows_of(events: pd.DataFrame, category: str, kind: str) -> np.ndarray:
    """Row positions of one category and kind, compared on the categorical codes (no copies)."""
    cat, knd = events["category"].cat, events["kind"].cat
    if category not in cat.categories or kind not in knd.categories:
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero((cat.codes.to_numpy() == cat.categories.get_loc(category))
                          & (knd.codes.to_numpy() == knd.categories.get_loc(kind)))


def _bare_steps(events: pd.DataFrame) -> pd.DataFrame:
    """Step rows from the step marks. Steps belong to the thread whose loop marked
    them (SPEC §3): each runs to the next mark of its process and thread, the last
    one to the process's last event. An end mark with an argument was written for
    another thread's loop (at session end): the argument is that thread. An
    interrupted mark begins nothing: it flags a step (``_flag_interrupted``)."""
    rows = _rows_of(events, "step", "instant")
    flags = rows[(events["name"].iloc[rows] == INTERRUPTED).to_numpy()] if len(rows) else rows
    if len(flags):
        rows = np.setdiff1d(rows, flags, assume_unique=True)
    if not len(rows):
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in STEP_PHASE_COLUMNS[:9]})
    all_codes = events["process"].cat.codes.to_numpy()
    all_ends = events["end_ns"].to_numpy()
    names = events["name"].iloc[rows].cat.remove_unused_categories()
    is_end = (names == END_MARK).to_numpy()
    arg = events["arg"].to_numpy()[rows]
    thread = np.where(is_end & (arg > 0), arg, events["tid"].to_numpy()[rows]).astype(np.int64)
    proc = all_codes[rows]
    start = events["start_ns"].to_numpy()[rows]
    order = np.lexsort((start, thread, proc))
    if not np.all(order == np.arange(len(order))):
        rows, proc, start, thread, is_end = rows[order], proc[order], start[order], thread[order], is_end[order]
        names = names.iloc[order]
    end = np.empty_like(start)
    end[:-1] = start[1:]
    last = np.flatnonzero(np.append((proc[1:] != proc[:-1]) | (thread[1:] != thread[:-1]), True))
    for code in np.unique(proc[last]):
        end[last[proc[last] == code]] = all_ends[all_codes == code].max()
    keep = ~is_end
    steps = pd.DataFrame({
        "process": pd.Categorical.from_codes(proc[keep], events["process"].cat.categories),
        "pid": events["pid"].to_numpy()[rows[keep]],
        "rank": events["rank"].array[rows[keep]].astype("Int64"),
        "tid": thread[keep],
        "mode": names[keep].cat.remove_unused_categories().array,
        "step": events["arg"].to_numpy()[rows[keep]],
        "start_ns": start[keep], "end_ns": end[keep]})
    if steps["tid"].groupby(steps["process"], observed=True).nunique().max() > 1:
        steps = steps.sort_values(["process", "start_ns"], kind="stable", ignore_index=True)
    steps["duration_ns"] = steps["end_ns"] - steps["start_ns"]
    if len(flags):
        _flag_interrupted(steps, events, flags)
    return steps


def _flag_interrupted(steps: pd.DataFrame, events: pd.DataFrame, flags: np.ndarray) -> None:
    """Gives the steps that interrupted marks flag the mode ``interrupted``: per mark, the
    latest step of its process and thread with the mark's number that began at or before it
    (a mark that matches none, in a file cut short, is dropped)."""
    mode = steps["mode"].astype(object).to_numpy().copy()
    procs = events["process"].to_numpy()[flags]
    tids, times, numbers = (events[c].to_numpy()[flags] for c in ("tid", "start_ns", "arg"))
    process = steps["process"].to_numpy()
    for proc, tid, at, number in zip(procs, tids, times, numbers):
        match = np.flatnonzero((process == proc) & (steps["tid"].to_numpy() == tid)
                               & (steps["step"].to_numpy() == number) & (steps["start_ns"].to_numpy() <= at))
        if len(match):
            mode[match[np.argmax(steps["start_ns"].to_numpy()[match])]] = INTERRUPTED
    steps["mode"] = pd.Categorical(mode)


def exclusive_durations(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Each span's time minus the spans nested in it on the same thread."""
    dur = end - start
    if len(dur) < 2:
        return dur
    same = tid[1:] == tid[:-1]
    if np.all(~same | (start[1:] >= start[:-1])) and not np.any(same & (start[1:] < end[:-1])):
        return dur  # already in order and nothing nests: the common case, no sort, no loop
    order = np.lexsort((start - end, start, tid))  # per thread, parents first
    s, e, t = start[order], end[order], tid[order]
    if not np.any((t[1:] == t[:-1]) & (s[1:] < e[:-1])):
        return dur
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


def attribute_to_steps(steps: pd.DataFrame, process: str, starts: np.ndarray, out: np.ndarray,
               tids: Optional[np.ndarray] = None) -> None:
    """Writes into ``out`` the row labels of the steps (of one process) that contain each
    start time, or -1. In place: on large runs every temporary here is tens of MB.
    ``tids``: the threads of the starts; where the process ran loops in several threads
    at once, a span on one of those threads belongs to that thread's steps."""
    mine = np.flatnonzero((steps["process"] == process).to_numpy())
    if not len(mine):
        out[:] = -1
        return
    threads = np.unique(steps["tid"].to_numpy()[mine])
    if tids is not None and len(threads) > 1:
        _attribute_among(steps, mine, starts, out)  # spans on other threads: by time alone
        step_tid = steps["tid"].to_numpy()[mine]
        for t in threads:
            on_t = np.flatnonzero(tids == t)
            if len(on_t):
                sub = np.empty(len(on_t), dtype=out.dtype)
                _attribute_among(steps, mine[step_tid == t], starts[on_t], sub)
                out[on_t] = sub
        return
    _attribute_among(steps, mine, starts, out)


def _attribute_among(steps: pd.DataFrame, mine: np.ndarray, starts: np.ndarray, out: np.ndarray) -> None:
    s_start = steps["start_ns"].to_numpy()[mine]
    order = np.argsort(s_start, kind="stable")  # sorted already: a cheap pass
    s_start, s_end, labels = (s_start[order], steps["end_ns"].to_numpy()[mine][order],
                              steps.index.to_numpy()[mine][order])
    where = np.searchsorted(s_start, starts, side="right")
    where -= 1
    before = where < 0
    np.maximum(where, 0, out=where)
    np.take(labels, where, out=out)
    np.take(s_end, where, out=where)  # reuse: each start's step end
    before |= starts >= where
    out[before] = -1


def _process_blocks(process_codes: np.ndarray):
    """(code, slice) per process. The events table keeps each process's events together,
    so a process's phases are one contiguous block (views, not copies)."""
    if len(process_codes) and np.all(process_codes[1:] >= process_codes[:-1]):
        cuts = np.flatnonzero(process_codes[1:] != process_codes[:-1]) + 1
        bounds = [0, *cuts.tolist(), len(process_codes)]
        return [(int(process_codes[lo]), slice(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
    return [(int(code), np.flatnonzero(process_codes == code)) for code in np.unique(process_codes)]


def phases_frame(events: pd.DataFrame, steps: pd.DataFrame):
    """Phase spans, each attributed to the step it starts in (by time, per process).
    Returns (phases, step_row): the row label in ``steps`` of each phase's step, or -1."""
    rows = _rows_of(events, "phase", "span")
    if not len(rows):
        return pd.DataFrame({c: [] for c in PHASE_COLUMNS}), np.empty(0, dtype=np.int64)
    col = {c: events[c].to_numpy()[rows] for c in ("pid", "tid", "start_ns", "end_ns", "duration_ns")}
    names = events["name"].iloc[rows].cat.remove_unused_categories()
    processes = events["process"].iloc[rows]
    counted_codes = [i for i, c in enumerate(names.cat.categories) if c in PHASES]
    codes = names.cat.codes.to_numpy()
    labels = np.empty(len(rows), dtype=np.int64)
    excl = col["duration_ns"].copy()
    for code, mine in _process_blocks(processes.cat.codes.to_numpy()):
        start, end, tid = col["start_ns"][mine], col["end_ns"][mine], col["tid"][mine]
        attribute_to_steps(steps, processes.cat.categories[code], start, labels[mine], tid)
        counted = np.isin(codes[mine], counted_codes)
        if counted.all():  # the usual case: views, no copies
            excl[mine] = exclusive_durations(start, end, tid)
            continue
        # Recompute stays inside Backward's time: only the five phases nest here.
        at = np.flatnonzero(counted)
        sub = excl[mine]
        sub[at] = exclusive_durations(start[at], end[at], tid[at])
        excl[mine] = sub
    has = labels >= 0
    safe = np.where(has, labels, 0)
    if len(steps):
        step_mode = steps["mode"].astype("category")
        mode_codes = step_mode.cat.codes.to_numpy()[safe]
        mode_codes[~has] = -1
        mode = pd.Categorical.from_codes(mode_codes, step_mode.cat.categories)
        step = steps["step"].to_numpy().astype(np.int32)[safe]
        step[~has] = -1
    else:
        mode = pd.Categorical.from_codes(np.full(len(rows), -1), ["train"])
        step = np.full(len(rows), -1, dtype=np.int32)
    del safe, has
    rank = events["rank"].array[rows]
    del rows
    phases = pd.DataFrame({
        "process": processes.array, "pid": col["pid"], "rank": rank,
        "tid": col["tid"], "mode": mode, "step": step, "name": names.array,
        "start_ns": col["start_ns"], "end_ns": col["end_ns"], "duration_ns": col["duration_ns"],
        "exclusive_ns": excl}, copy=False)
    return phases, labels


def _take_out_profiler_work(events: pd.DataFrame, phases: pd.DataFrame, row: np.ndarray,
                            n_steps: int) -> Optional[np.ndarray]:
    """stepscope's own work inside a phase is not the phase's time: opening a PyTorch
    operator window (``stepscope.op_window_open``: Kineto started, ~1-2 ms here) falls
    inside the phase that began its first step, and closing one (``stepscope.op_window``:
    Kineto's events read and written, ~1 ms to a few hundred for steps of many small
    ops) inside whatever phase the next step began in. It leaves that phase's exclusive
    time (``phases`` in place) and counts in the step's Other; returns the time taken out
    per step, or None. A long run has thousands of windows and millions of phases: one
    sort per thread that has windows, then binary searches."""
    windows = _rows_of(events, "framework", "span")
    if len(windows):
        windows = windows[events["name"].iloc[windows].isin(TORCH_OP_WINDOW_SPANS).to_numpy()]
    if not len(windows) or not len(phases):
        return None
    w_start, w_end = events["start_ns"].to_numpy()[windows], events["end_ns"].to_numpy()[windows]
    w_tid = events["tid"].to_numpy()[windows]
    w_process = events["process"].iloc[windows].astype(str).to_numpy()
    p_cats, p_codes = phases["process"].cat.categories, phases["process"].cat.codes.to_numpy()
    p_start, p_end, p_tid = phases["start_ns"].to_numpy(), phases["end_ns"].to_numpy(), phases["tid"].to_numpy()
    names = phases["name"].cat
    counted = np.isin(names.codes.to_numpy(), [i for i, c in enumerate(names.categories) if c in PHASES])
    excl = phases["exclusive_ns"].to_numpy().copy()
    taken = np.zeros(n_steps, dtype=np.int64)
    for process, tid in sorted(set(zip(w_process, w_tid.tolist()))):
        if process not in p_cats:
            continue
        on = np.flatnonzero((p_codes == p_cats.get_loc(process)) & (p_tid == tid) & counted & (row >= 0))
        if not len(on):
            continue
        on = on[np.argsort(p_start[on], kind="stable")]
        mine = (w_process == process) & (w_tid == tid)
        ws, we = w_start[mine], w_end[mine]
        at = np.searchsorted(p_start[on], ws, side="right") - 1  # the latest phase begun by then
        found = np.full(len(ws), -1, dtype=np.int64)
        for back in range(4):  # phases nest a level or two (Loss in a Forward): walk out
            i = at - back
            ok = (found < 0) & (i >= 0)
            ok[ok] &= p_end[on[i[ok]]] >= we[ok]
            found[ok] = on[i[ok]]
        hit = found >= 0  # a window between phases is in Other already
        idx = found[hit]
        cut = np.minimum((we - ws)[hit], excl[idx])
        np.subtract.at(excl, idx, cut)
        np.add.at(taken, row[idx], cut)
    phases["exclusive_ns"] = excl
    return taken


def _covered_per_step(row: np.ndarray, starts: np.ndarray, ends: np.ndarray, step_end: np.ndarray) -> np.ndarray:
    """Per step, the length of the union of its phases (each clipped to its step's end;
    ``row`` -1 for phases outside every step, which cover nothing).

    The furthest end so far is taken per step: steps of different processes (or
    threads) overlap in time, so a running maximum over all rows would carry one
    process's late ends into the next one's steps and count their gaps as covered."""
    out = np.zeros(len(step_end), dtype=np.int64)
    inside = row >= 0
    if not inside.all():  # phases outside every step cover nothing
        row, starts, ends = row[inside], starts[inside], ends[inside]
    if len(row) == 0:
        return out
    if not (np.all(row[1:] >= row[:-1]) and np.all((row[1:] != row[:-1]) | (starts[1:] >= starts[:-1]))):
        order = np.lexsort((starts, row))  # phases usually come in this order already
        row, starts, ends = row[order], starts[order], ends[order]
    ends = np.minimum(ends, step_end[row])
    reach = pd.Series(ends).groupby(row, sort=False).cummax().to_numpy()  # furthest end so far, per step
    new_block = np.ones(len(row), dtype=bool)
    new_block[1:] = (row[1:] != row[:-1]) | (starts[1:] > reach[:-1])
    del reach
    firsts = np.flatnonzero(new_block)
    np.add.at(out, row[firsts], np.maximum.reduceat(ends, firsts) - starts[firsts])
    return out


def steps_and_phases(events: pd.DataFrame, native: bool = True, consume: bool = False):
    """(steps, phases): steps carry each phase's exclusive time, Other, the step's
    communication (``comm.step_columns``) and compile time (``compiling.per_step``).

    The functions above define both tables; ``native`` (the default) computes them
    with one native pass per process (``step_pass``), which tests hold equal to
    this definition (``native=False``). ``consume``: the caller gives ``events`` up,
    and the native pass drops each of its columns once read (a long run's phases are
    millions of rows: the events and the tables are not all held at once)."""
    events = voided(events)
    comm_rows = comm.comm_events(events) if consume else events  # (all comm needs of them)
    compile_spans = compiling.spans(events)
    marks = loop_marks(events)
    out = step_pass.steps_and_phases(events, consume=consume) if native else None
    steps, phases = out if out is not None else _steps_and_phases(events)
    steps = comm.step_columns(steps, comm_rows)
    steps[STEP_COMPILE_COLUMN] = compiling.per_step(steps, compile_spans)
    steps[STEP_LOOP_COLUMN] = loop_numbers(steps, marks).to_numpy()
    return steps, phases


def loop_marks(events: pd.DataFrame) -> pd.DataFrame:
    """The loop marks (``LOOP_MARK``): process and start_ns."""
    rows = _rows_of(events, "framework", "instant")
    if len(rows):
        rows = rows[(events["name"].iloc[rows] == LOOP_MARK).to_numpy()]
    # (the marks' rows first: a categorical's to_numpy() is an object array of every row,
    # 6 M strings' worth a process on a long run, the build's peak when it came first)
    return pd.DataFrame({"process": events["process"].iloc[rows].astype(str).to_numpy(),
                         "start_ns": events["start_ns"].to_numpy()[rows]})


def voided(events: pd.DataFrame) -> pd.DataFrame:
    """``events`` with each void mark (``VOID_MARK``) and the begin mark of the step it
    voids (the latest of its process and thread with its number, begun by then) read as
    end marks: that call met the end of the data, and its time lies after its loop. The
    frame itself when no mark voids a step (a copy of two columns otherwise)."""
    names = events["name"]
    if VOID_MARK not in names.cat.categories:
        return events
    rows = _rows_of(events, "step", "instant")
    codes = names.cat.codes.to_numpy()
    voids = rows[codes[rows] == names.cat.categories.get_loc(VOID_MARK)]
    if not len(voids):
        return events
    categories = list(names.cat.categories)
    if END_MARK not in categories:
        categories.append(END_MARK)
    end = categories.index(END_MARK)
    flagged = (INTERRUPTED, VOID_MARK, END_MARK)
    begins = rows[~np.isin(codes[rows], [categories.index(n) for n in flagged if n in categories])]
    proc, tid = events["process"].cat.codes.to_numpy(), events["tid"].to_numpy()
    start, arg = events["start_ns"].to_numpy(), events["arg"].to_numpy()
    new_codes, new_arg = codes.copy(), arg.copy()
    for v in voids:
        match = begins[(proc[begins] == proc[v]) & (tid[begins] == tid[v]) & (arg[begins] == arg[v])
                       & (start[begins] <= start[v])]
        if len(match):
            new_codes[match[np.argmax(start[match])]] = end
        new_codes[v] = end
    new_arg[new_codes != codes] = 0  # (an end mark's argument names another thread)
    return events.assign(name=pd.Categorical.from_codes(new_codes, categories), arg=new_arg)


def _steps_and_phases(events: pd.DataFrame):
    steps = _bare_steps(events)
    phases, row = phases_frame(events, steps)
    for name in PHASES:
        steps[name] = np.int64(0)
    steps["Other"] = steps["duration_ns"]
    if len(phases) and len(steps):
        taken = _take_out_profiler_work(events, phases, row, len(steps))
        inside = row >= 0
        everywhere = bool(inside.all())
        excl = phases["exclusive_ns"].to_numpy()
        name_codes = phases["name"].cat.codes.to_numpy()
        for i, name in enumerate(phases["name"].cat.categories):
            if name not in PHASES:
                continue
            sel = name_codes == i
            if not everywhere:
                sel &= inside
            steps[name] = np.bincount(row[sel], weights=excl[sel], minlength=len(steps)).astype(np.int64)
            del sel
        covered = _covered_per_step(row, phases["start_ns"].to_numpy(), phases["end_ns"].to_numpy(),
                                    steps["end_ns"].to_numpy())
        if taken is not None:
            covered = np.maximum(covered - taken, 0)
        steps["Other"] = np.maximum(steps["duration_ns"].to_numpy() - covered, 0)
    return steps[STEP_PHASE_COLUMNS], phases[PHASE_COLUMNS]
