"""The native attribution of GPU records (csrc/aggregate/attribution.h) held equal to its
definition in analysis/tables/gpu.py (``_innermost_segments``, ``_lookup``): on random
spans with the edge cases a trace has (nesting, equal starts, empty spans, clock rounding
between neighbours) and on the GPU fixtures recorded on an H200 (issue 43)."""

from __future__ import annotations

import numpy as np
import pytest

import stepscope
from stepscope.analysis.tables import gpu
from stepscope.core import decoding

def _spans(rng, n):
    """Phase-like spans: mostly one after the other, some nested (an LBFGS step's Forward in
    its Optimizer), some touching or overlapping their neighbour, some empty, some equal."""
    start = np.cumsum(rng.integers(0, 40, n)).astype(np.int64)
    end = start + rng.integers(0, 60, n)
    nest = rng.random(n) < 0.2
    end[nest] = start[nest] + rng.integers(100, 400, int(nest.sum()))  # long parents over several spans
    empty = rng.random(n) < 0.05
    end[empty] = start[empty]
    same = np.flatnonzero(rng.random(n) < 0.05)
    start[same[same > 0]] = start[same[same > 0] - 1]  # equal starts (ties: the longer first)
    end = np.maximum(end, start)
    shuffle = rng.permutation(n)
    return start[shuffle], end[shuffle]


@pytest.mark.parametrize("seed", range(12))
def test_innermost_segments_equal_the_definition(seed):
    rng = np.random.default_rng(seed)
    for n in (0, 1, 2, 3, int(rng.integers(4, 3000))):
        start, end = _spans(rng, n)
        want = gpu._innermost_segments(start, end)
        got = decoding.innermost_segments(start, end)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(np.asarray(w, dtype=np.int64), g)


def test_disjoint_spans_are_their_own_segments_and_empty_ones_none():
    start = np.array([0, 10, 20, 20], dtype=np.int64)
    end = np.array([10, 15, 20, 30], dtype=np.int64)
    s, e, i = decoding.innermost_segments(start, end)
    assert s.tolist() == [0, 10, 20] and e.tolist() == [10, 15, 30] and i.tolist() == [0, 1, 3]
    # a child inside its parent: parent, child, parent again
    s, e, i = decoding.innermost_segments(np.array([0, 5], dtype=np.int64), np.array([20, 8], dtype=np.int64))
    assert list(zip(s.tolist(), e.tolist(), i.tolist())) == [(0, 5, 0), (5, 8, 1), (8, 20, 0)]


@pytest.mark.parametrize("seed", range(12))
def test_lookups_equal_the_definition_in_any_order_of_times(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(0, 2000))
    start = np.sort(rng.integers(0, 10 * max(n, 1), n)).astype(np.int64)
    end = start + rng.integers(0, 30, n)  # gaps, overlaps (steps of two loop threads) and empty intervals
    values = rng.integers(-1, 50, n).astype(np.int64)
    m = int(rng.integers(0, 5000))
    times = rng.integers(-20, 10 * max(n, 1) + 40, m).astype(np.int64)
    times[rng.random(m) < 0.05] = -1  # a record whose launch was not found
    for t in (times, np.sort(times), np.sort(times)[::-1].copy()):
        at = gpu._lookup(start, end, np.where(t >= 0, t, np.iinfo(np.int64).min))
        want = np.where(at >= 0, values[np.clip(at, 0, None)] if n else -1, -1)
        got, rows = decoding.attribute(start, end, [values, np.arange(n, dtype=np.int64)], t)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(rows, at)


def test_lookup_columns_must_match():
    a = np.arange(3, dtype=np.int64)
    with pytest.raises(ValueError):
        decoding.attribute(a, a[:2], [a], a)
    with pytest.raises(ValueError):
        decoding.attribute(a, a, [a[:1]], a)


def _reference_codes(timeline, process, times):
    """``Timeline.codes`` as gpu.py defines it: ``_lookup`` in the steps and in the segments
    of ``_innermost_segments``, in NumPy."""
    n = len(times)
    mode, step, phase = (np.full(n, -1, dtype=np.int64) for _ in range(3))
    steps = timeline.steps[timeline.steps["process"] == process]
    t = np.where(times >= 0, times, np.iinfo(np.int64).min)
    if len(steps):
        order = np.argsort(steps["start_ns"].to_numpy(), kind="stable")
        codes = np.array([timeline.modes.index(str(m)) for m in steps["mode"].astype(object)], dtype=np.int64)
        at = gpu._lookup(steps["start_ns"].to_numpy()[order], steps["end_ns"].to_numpy()[order], t)
        hit = at >= 0
        mode[hit] = codes[order][at[hit]]
        step[hit] = steps["step"].to_numpy()[order][at[hit]]
    phases = timeline.phases[timeline.phases["process"] == process]
    if len(phases):
        s, e, idx = gpu._innermost_segments(phases["start_ns"].to_numpy(), phases["end_ns"].to_numpy())
        names = np.array([timeline.phase_names.index(str(p)) for p in phases["name"].astype(object)], dtype=np.int64)
        at = gpu._lookup(s, e, t)
        hit = at >= 0
        phase[hit] = names[idx][at[hit]]
    return mode, step, phase


@pytest.mark.parametrize("name", ["gpu-train", "gpu-profiler"])
def test_gpu_fixture_records_are_attributed_as_defined(gpu_fixture_runs, name):
    run = stepscope.load(gpu_fixture_runs / name, quiet=True)
    timeline = gpu.Timeline(run.steps, run.phases)
    k, api = run.kernels, run.cuda_api
    assert len(k) and len(api)
    checked = 0
    for process in run.steps["process"].unique():
        for frame, column in ((k, "launch_start_ns"), (api, "start_ns")):
            mine = frame[frame["process"] == process]
            times = mine[column].astype("Int64").fillna(-1).to_numpy(np.int64)
            got = timeline.codes(process, times)
            for g, w in zip(got, _reference_codes(timeline, process, times)):
                np.testing.assert_array_equal(g, w)
            # and the tables carry them: the step of each kernel is the step its launch ran in
            checked += int((got[1] >= 0).sum())
            np.testing.assert_array_equal(mine["step"].to_numpy(np.int64), got[1])
    assert checked > 100
