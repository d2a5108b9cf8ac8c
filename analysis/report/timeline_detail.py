"""Which parts of the timeline the report keeps in full detail, and how the rest is reduced.

A report must stay a few MB whatever the run's length, so the timeline keeps
every span only for a bounded set of steps chosen for meaning (``choose_steps``:
the first step, the first steps after warm-up, the median step, the slowest
steps, the steps the findings name, a median step of every other mode, and
steps asked for with ``stepscope report --steps``). Every other span is folded
into step-level coverage bars: per track row and per step one item that keeps
how many spans it stands for and how densely they fill it (consecutive steps
share a bar when even that is too much). Whatever the viewer draws stays
zoomable; the Perfetto export has every event.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from stepscope.analysis.store.frames import as_strings

DETAIL_ITEMS = 30_000  # spans of the chosen steps (about 27 bytes an item in the page)
OVERVIEW_ITEMS = 15_000  # coverage bars for the rest of the run
REQUESTED_ITEMS = 1_000_000  # when steps are asked for by hand, the user accepts a larger page
SLOWEST, AFTER_WARMUP, PER_FINDING = 3, 2, 3


def parse_steps(text: str) -> list:
    """`10-20,35` -> [(10, 20), (35, 35)]; ValueError on anything else."""
    out = []
    for part in str(text).split(","):
        a, _, b = part.strip().partition("-")
        lo, hi = int(a), int(b) if b else int(a)
        if lo < 0 or hi < lo:
            raise ValueError(f"bad step range {part!r}")
        out.append((lo, hi))
    return out


def _finding_steps(evidence) -> list:
    """Step numbers an evidence dict names: `step` values, `steps` / `step_range` pairs."""
    found = []

    def walk(value, key=None):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, (list, tuple)):
            if key in ("steps", "step_range") and len(value) == 2 and all(isinstance(v, int) for v in value):
                found.extend(value)
            else:
                for v in value:
                    walk(v)
        elif key == "step" and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            found.append(int(value))

    walk(evidence)
    return list(dict.fromkeys(found))


def choose_steps(steps: pd.DataFrame, findings=(), requested=None, sampled=()) -> list:
    """[{"mode", "step", "why"}] in mode and step order. A step's time is its slowest process's.
    sampled: (mode, step) of the steps with operator events (their ops show in detail)."""
    if steps.empty:
        return []
    chosen: dict = {}

    def add(mode, step, why):
        reasons = chosen.setdefault((str(mode), int(step)), [])
        if why not in reasons:
            reasons.append(why)

    text, code = _texts(steps["mode"])  # (no string a step: millions of steps have a few modes)
    counts = np.bincount(code, minlength=len(text))
    if counts[text == "train"].sum():
        main = "train"
    else:  # the most frequent; of equals, the first to occur (as value_counts gives it)
        top = np.flatnonzero(counts == counts.max())
        main = text[top[int(np.argmin([np.argmax(code == t) for t in top]))]]
    step_numbers, durations = steps["step"].to_numpy(), steps["duration_ns"].to_numpy()
    for i, mode in enumerate(text):  # (as groupby(modes, sort=True) gives them, without copying the steps)
        rows = np.flatnonzero(code == i)
        if not len(rows):
            continue
        per = pd.Series(durations[rows]).groupby(step_numbers[rows]).max().sort_index()
        d, nums = per.to_numpy(), per.index.to_numpy()
        med = np.median(d)
        if mode != main:
            add(mode, nums[np.argmin(np.abs(d - med))], "median step")
            continue
        add(mode, nums[0], "first step")
        # warm-up (compilation, caches, allocator pools) ends where three steps in a row stay near the median
        ok = d <= 1.5 * med
        warm = next((i for i in range(1, len(d)) if ok[i:i + 3].all()), len(d))
        for i in range(warm, min(warm + AFTER_WARMUP, len(d))):
            add(mode, nums[i], "first steps after warm-up")
        rest_d, rest_n = (d[warm:], nums[warm:]) if warm < len(d) else (d, nums)
        add(mode, rest_n[np.argmin(np.abs(rest_d - np.median(rest_d)))], "median step")
        for i in np.argsort(-rest_d, kind="stable")[:SLOWEST]:
            add(mode, rest_n[i], "slowest")
        for f in findings:
            named = _finding_steps(f.get("evidence", {}))
            named = [n for n, ok in zip(named, np.isin(named, nums)) if ok]
            for n in named[:PER_FINDING]:
                add(mode, n, f"named by {f.get('rule', 'a finding')}")
        for lo, hi in requested or ():
            for n in nums[(nums >= lo) & (nums <= hi)]:
                add(mode, n, "asked for")
    sampled = list(sampled)
    if sampled:  # (a run of millions of steps has no set of them built for nothing)
        known = set(zip(as_strings(steps["mode"]), steps["step"].astype(int)))
        for mode, n in sampled:
            if (str(mode), int(n)) in known:
                add(mode, n, "operators sampled")
    return [{"mode": m, "step": n, "why": ", ".join(w)} for (m, n), w in sorted(chosen.items())]


def _texts(mode: pd.Series):
    """(sorted distinct texts, each row's index among them) of a mode column as ``as_strings``
    writes it, from its categories (a run's millions of steps have a few modes)."""
    cat = pd.Categorical(mode)
    names = np.array([str(c) for c in cat.categories] + ["nan"], dtype=object)
    text, of_name = np.unique(names, return_inverse=True)
    codes = np.asarray(cat.codes, dtype=np.int64)
    return text, of_name[np.where(codes < 0, len(names) - 1, codes)]


def _window_of(x: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each x, the index of the latest window (sorted by start) starting at or before it
    when the union of [starts, ends) holds x; else -1."""
    if not len(starts):
        return np.full(len(x), -1, dtype=np.int64)
    reach = np.maximum.accumulate(ends)
    i = np.searchsorted(starts, x, side="right") - 1
    return np.where((i >= 0) & (x < reach[np.maximum(i, 0)]), i, -1)


PRIORITY = ("asked for", "slowest", "named by", "operators sampled", "median step", "first steps after warm-up",
            "first step")


def _priority(why: str) -> int:
    return min(next((k for k, p in enumerate(PRIORITY) if w.startswith(p)), len(PRIORITY)) for w in why.split(", "))


def _groups(new: np.ndarray) -> int:
    return int(np.count_nonzero(new))


def merge(row, start, end, name, cat, arg, new, mixed):
    """Items merged per group (`new` marks each group's first item) into coverage items:
    the group's extent, its count, how densely its spans fill it (1..255), its name if shared."""
    first = np.flatnonzero(new)
    count = np.diff(np.append(first, len(row)))
    g_end = np.maximum.reduceat(end, first)
    g_start = start[first]
    same_name = np.minimum.reduceat(name, first) == np.maximum.reduceat(name, first)
    busy = np.add.reduceat(end - start, first)
    fill = np.where(count > 1, np.clip(np.round(255 * busy / np.maximum(g_end - g_start, 1)), 1, 255), 255)
    return (row[first], g_start, g_end, np.where(same_name, name[first], mixed), cat[first],
            np.minimum.reduceat(arg, first), count, fill.astype(np.uint8))


def _quantum_groups(row, start, end, q):
    """Spans shorter than q grouped per row and q-long bucket; longer spans alone."""
    short = (end - start) < q
    bucket = start // q
    new = np.ones(len(row), dtype=bool)
    new[1:] = ~short[1:] | ~short[:-1] | (row[1:] != row[:-1]) | (bucket[1:] != bucket[:-1])
    return new


def _fit_quantum(row, start, end, cap):
    """The smallest power-of-two quantum (ns) whose grouping fits the cap."""
    lo, hi = 4, 44  # 16 ns to 5 hours
    while lo < hi:
        k = (lo + hi) // 2
        if _groups(_quantum_groups(row, start, end, 1 << k)) <= cap:
            hi = k
        else:
            lo = k + 1
    return 1 << lo


def _step_groups(row, bucket, per_bar):
    b = np.floor_divide(bucket, per_bar)
    new = np.ones(len(row), dtype=bool)
    new[1:] = (row[1:] != row[:-1]) | (b[1:] != b[:-1])
    return new


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)``, at once where the values already increase (a process's step
    starts nearly always do; numpy's unique of a million of them takes most of a second)."""
    if len(values) < 2 or bool(np.all(values[1:] > values[:-1])):
        return values
    return np.unique(values)


def chosen_ids(steps: pd.DataFrame, chosen: list) -> np.ndarray:
    """Each step's place in ``chosen`` (by its mode and number), or -1. Only the steps whose
    number was chosen are matched by mode (a process has millions of steps, a few chosen)."""
    k_of: dict = {}
    for k, c in enumerate(chosen):
        k_of.setdefault((str(c["mode"]), int(c["step"])), k)
    numbers = steps["step"].to_numpy(np.int64)
    ids = np.full(len(steps), -1, dtype=np.int64)
    at = np.flatnonzero(np.isin(numbers, [step for _, step in k_of]))
    ids[at] = [k_of.get((mode, int(n)), -1) for mode, n in zip(as_strings(steps["mode"].iloc[at]), numbers[at])]
    return ids


def reduce_items(items, row_process, row_device, process_steps, chosen, mixed, detail_cap, overview_cap):
    """items: (row, start, end, name, cat, arg), rows ascending, each row in start order.
    row_process: process node of each row; row_device: rows of GPU streams; process_steps:
    {process node: its steps (start_ns, end_ns, mode, step) on the timeline's clock}.
    Returns the kept items with count and fill (None when nothing was merged) and what was done."""
    row, start, end, name, cat, arg = items
    which = np.full(len(row), -1, dtype=np.int64)  # the chosen step an item falls in
    bucket = np.zeros(len(row), dtype=np.int64)
    item_process = row_process[row]
    device = row_device[row]
    for p, s in process_steps.items():
        mask = item_process == p
        if not mask.any() or s.empty:
            continue
        bounds = _sorted_unique(np.append(s["start_ns"].to_numpy(), s["end_ns"].max()))
        bucket[mask] = np.searchsorted(bounds, start[mask], side="right")  # 0: before the first step
        ids = chosen_ids(s, chosen)
        picked = s[ids >= 0].assign(k=ids[ids >= 0]).sort_values("start_ns")
        ws, we, wk = picked["start_ns"].to_numpy(), picked["end_ns"].to_numpy(), picked["k"].to_numpy()
        # GPU work runs behind the host: a stream keeps a chosen step's window one step longer
        for dev in (False, True):
            sel = mask & (device == dev)
            if sel.any():
                w = _window_of(start[sel], ws, we + (we - ws) * dev)
                which[sel] = np.where(w >= 0, wk[np.maximum(w, 0)], -1)
    # too many spans in the chosen steps: keep the most telling steps whole, drop the others
    per_step = np.bincount(which[which >= 0], minlength=len(chosen))
    keep, total = [], 0
    for k in sorted(range(len(chosen)), key=lambda k: (_priority(chosen[k]["why"]), chosen[k]["step"])):
        if not keep or total + per_step[k] <= detail_cap:
            keep.append(k)
            total += per_step[k]
    kept = np.zeros(len(chosen) + 1, dtype=bool)
    kept[keep] = True
    in_detail = kept[which]  # which == -1 reads the trailing False
    chosen[:] = [c for k, c in enumerate(chosen) if kept[k]]
    done = {"spans": int(len(row)), "detail_spans": int(in_detail.sum()), "detail_quantum_ns": 0,
            "overview_steps_per_bar": 0, "overview_quantum_ns": 0}
    parts, merged = [], False
    d = np.flatnonzero(in_detail)
    if len(d) > detail_cap:
        q = _fit_quantum(row[d], start[d], end[d], detail_cap)
        done["detail_quantum_ns"] = q
        new = _quantum_groups(row[d], start[d], end[d], q)
        parts.append(merge(*(a[d] for a in items), new, mixed))
        merged = True
    else:
        parts.append(tuple(a[d] for a in items) + (np.ones(len(d), np.int64), np.full(len(d), 255, np.uint8)))
    o = np.flatnonzero(~in_detail)
    if len(o) > overview_cap and process_steps:
        # the fewest steps per bar (a power of two) that fit: the bars only merge as it
        # doubles, so a binary search over the powers finds it (a million steps: 6 tries, not 20)
        ro, bo = row[o], bucket[o]
        lo, hi = 0, 40
        while lo < hi:
            mid = (lo + hi) // 2
            if _groups(_step_groups(ro, bo, 1 << mid)) > overview_cap:
                lo = mid + 1
            else:
                hi = mid
        done["overview_steps_per_bar"] = per_bar = 1 << lo
        parts.append(merge(*(a[o] for a in items), _step_groups(ro, bo, per_bar), mixed))
        merged = True
    elif len(o) > overview_cap:  # a run without steps: time buckets instead
        done["overview_quantum_ns"] = q = _fit_quantum(row[o], start[o], end[o], overview_cap)
        parts.append(merge(*(a[o] for a in items), _quantum_groups(row[o], start[o], end[o], q), mixed))
        merged = True
    else:
        parts.append(tuple(a[o] for a in items) + (np.ones(len(o), np.int64), np.full(len(o), 255, np.uint8)))
    out = [np.concatenate(c) for c in zip(*parts)]
    order = np.lexsort((out[1], out[0]))  # rows ascending, each in start order
    out = [a[order] for a in out]
    done["merged"] = merged
    return out, done


# Phases outside the chosen steps a large run's overview reads at most about this many of
# (the overview shows OVERVIEW_ITEMS coverage bars; a run of millions of steps has tens
# of millions of phases, which would take minutes and many GB to lay out for that)
OVERVIEW_PHASES = 1_000_000


def phase_sample(run) -> int:
    """k: a large run's overview shows the phases of every k-th step, to read about
    OVERVIEW_PHASES of them (1: every phase)."""
    total = run.rows("phases")
    return -(-total // OVERVIEW_PHASES) if total and total > OVERVIEW_PHASES and len(run.steps) else 1


def sampled_steps(run) -> Optional[list]:
    """The step numbers of every ``phase_sample``-th step, and -1 (the phases outside every
    step); None: every step."""
    k = phase_sample(run)
    if k == 1:
        return None
    first, last = int(run.steps["step"].min()), int(run.steps["step"].max())
    return [-1, *range(first - first % k, last + 1, k)]
