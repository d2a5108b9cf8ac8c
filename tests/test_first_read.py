"""The shortcuts the first and cached reads of a large run take, each held equal to the
plain pandas it replaces (issue 43): on random data with the edge cases the run has."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepscope.analysis.rules import steady
from stepscope.analysis.rules.gpudata import process_ranks, steps_by_process
from stepscope.analysis.store import dataset_read
from stepscope.analysis.store.frames import columns_of, concat, concat_in_order
from stepscope.analysis.store.reader import start_order


def _part(rng, n, t0, names):
    start = np.sort(rng.integers(t0, t0 + 10 * n, n))
    end = start + rng.integers(0, 50, n)
    frame = pd.DataFrame({
        "process": pd.Categorical(["p0"] * n), "name": pd.Categorical(rng.choice(names, n)),
        "rank": pd.array(np.where(rng.random(n) < 0.2, None, rng.integers(0, 4, n)), dtype="Int64"),
        "start_ns": start, "end_ns": end, "value": rng.random(n)})
    return frame.iloc[start_order(start, end)].reset_index(drop=True)


@pytest.mark.parametrize("seed", range(6))
def test_concat_in_order_moves_only_the_rows_out_of_place_and_equals_a_sort(seed):
    rng = np.random.default_rng(seed)
    # parts that overlap near their edges, as a trace decoded in parts does (spans written at their end)
    parts = [_part(rng, int(rng.integers(1, 400)), k * 3000 - int(rng.integers(0, 600)), ["a", "b", f"c{k}"])
             for k in range(int(rng.integers(1, 5)))]
    got = concat_in_order(parts, start_order)
    joined = concat(parts)
    want = joined.iloc[start_order(joined["start_ns"].to_numpy(), joined["end_ns"].to_numpy())]
    pd.testing.assert_frame_equal(got, want.reset_index(drop=True), check_categorical=False)
    for c in ("process", "name"):
        assert list(got[c].astype(object)) == list(want[c].astype(object))
    # parts given as columns apart (as the dataset build keeps them): the same, and each let go
    kept = [columns_of(p, np.ones(len(p), dtype=bool)) for p in parts]
    pd.testing.assert_frame_equal(concat_in_order(kept, start_order), got)
    assert all(not k for k in kept)


@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_steps_split_by_process_and_its_rank_pairs_equal_the_scans(seed, together):
    """(together: each process's rows, and each rank's in it, come one after another, as the
    dataset's steps do; else in random order)"""
    rng = np.random.default_rng(seed)
    n = 6000  # above the size where process_ranks hashes
    steps = pd.DataFrame({
        "process": pd.Categorical(rng.choice(["b", "a", "c"], n), categories=["c", "a", "b", "unused"]),
        "rank": pd.array(np.where(rng.random(n) < 0.1, None, rng.integers(0, 3, n)), dtype="Int64"),
        "mode": pd.Categorical(rng.choice(["train", "eval"], n)),
        "start_ns": rng.integers(0, 10**9, n), "end_ns": rng.integers(0, 10**9, n), "step": np.arange(n)})
    if together:
        steps = steps.sort_values(["process", "rank"], kind="stable").reset_index(drop=True)
    split = steps_by_process(steps, ["mode", "start_ns", "step"])
    assert list(split) == [k for k, _ in steps.groupby("process", observed=True, sort=False)]  # first seen first
    for process, part in split.items():
        pd.testing.assert_frame_equal(part, steps[steps["process"] == process][["mode", "start_ns", "step"]])
    pairs = steps[["process", "rank"]].drop_duplicates()
    want = [key for key, _ in pairs.groupby(["process", "rank"], dropna=False, sort=True, observed=True)]
    got = process_ranks(steps)
    assert len(got) == len(want)
    assert all(g[0] == w[0] and (g[1] is w[1] or pd.isna(g[1]) and pd.isna(w[1]) or g[1] == w[1])
               for g, w in zip(got, want))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 50])
def test_steady_states_median_of_three_steps_is_pandas_rolling_median(n):
    rng = np.random.default_rng(n)
    dur = rng.integers(1, 100, n).astype(float)
    typical = float(np.median(dur)) if n else 0.0
    want = pd.Series(dur, dtype=float).rolling(3, min_periods=1).median().shift(-2).fillna(typical).to_numpy()
    np.testing.assert_array_equal(steady.median_of_three(dur, typical), want)


def test_numbers_read_straight_into_numpy_have_the_dtypes_pandas_gives(tmp_path):
    frame = pd.DataFrame({"i32": np.arange(5, dtype=np.int32), "i64": np.arange(5) * 10**12,
                          "f": [0.5, np.nan, 1.0, 2.0, 3.0], "nullable": pd.array([1, 2, 3, 4, 5], dtype="Int64"),
                          "with_na": pd.array([1, None, 3, 4, 5], dtype="Int64"),
                          "cat": pd.Categorical(list("abcab"))})
    files = []
    for k in range(3):
        path = tmp_path / f"part-{k}.parquet"
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
        files.append(("p", str(path)))
    got, _ = dataset_read._read_files(files, None, {"p": 0}, ["p"])
    want = pd.concat([frame] * 3, ignore_index=True)
    pd.testing.assert_frame_equal(got.drop(columns=["process"]), want)


@pytest.mark.parametrize("seed", range(5))
def test_window_percentiles_are_numpys_of_each_window(seed):
    from stepscope.analysis.rules.lowgpu import window_percentiles

    rng = np.random.default_rng(seed)
    values = rng.choice([0.0, 3.5, 50.0, 99.0, 100.0], 3000) + rng.random(3000) * (seed % 2)
    cuts = np.sort(rng.integers(0, 3000, 400))
    lo, hi = cuts[:-1], cuts[1:] + rng.integers(0, 3, 399)
    hi = np.minimum(hi, 3000)
    p5, p95 = window_percentiles(values, lo, hi, 5)
    for a, b, x, y in zip(lo, hi, p5, p95):
        if b - a < 5:
            assert np.isnan(x) and np.isnan(y)
        else:
            assert (x, y) == tuple(np.percentile(values[a:b], [5, 95]))  # bit for bit


def test_the_timelines_step_modes_are_as_strings_gives_them_sorted():
    from stepscope.analysis.report.timeline_detail import _texts
    from stepscope.analysis.store.frames import as_strings

    rng = np.random.default_rng(0)
    mode = pd.Series(pd.Categorical(rng.choice(["train", "eval", "predict", None], 5000),
                                    categories=["train", "unused", "predict", "eval"]))
    text, code = _texts(mode)
    want_text, want_code = np.unique(as_strings(mode), return_inverse=True)
    used = np.unique(code)
    assert list(text[used]) == list(want_text)
    assert np.array_equal(np.searchsorted(want_text, text[code]), want_code)


@pytest.mark.parametrize("seed", range(4))
def test_kernel_aggregates_strings_equal_pandas_astype(seed):
    """kernel_steps' categorical-to-"str" shortcut (categories converted once) is astype("str"),
    missing values and unused categories included."""
    from stepscope.analysis.tables.kernel_steps import _strings

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 500))
    cats = ["train", "eval", "Forward", "unused"][: int(rng.integers(0, 5))]
    codes = rng.integers(-1, max(len(cats), 1), n) if cats else np.full(n, -1)
    column = pd.Series(pd.Categorical.from_codes(codes, cats), index=rng.permutation(n) + 7, name="mode")
    pd.testing.assert_series_equal(_strings(column), column.astype("str"))
    plain = pd.Series(rng.choice(["a", "b"], n), name="name")
    pd.testing.assert_series_equal(_strings(plain), plain.astype("str"))


@pytest.mark.parametrize("seed", range(8))
def test_split_equals_pandas_groupby_iteration(seed):
    """frames.split gives groupby(by, observed=True, sort=...)'s groups: keys, order, rows and
    index, for categorical and plain keys, with missing keys, unused categories, one group."""
    from stepscope.analysis.store.frames import split

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    one = seed % 4 == 3  # a table of a single group (taken whole)
    values = rng.choice(["train"] if one else ["train", "eval", "predict"], n)
    mode = pd.Series(values, dtype=object)
    if not one:
        mode[rng.random(n) < 0.1] = None
    frame = pd.DataFrame({
        "mode": pd.Categorical(mode, categories=["unused", "train", "predict", "eval"]) if seed % 2 else mode,
        "x": rng.random(n), "k": np.arange(n)}, index=rng.permutation(n) + 3)
    for sort in (False, True):
        want = [(k, g) for k, g in frame.groupby("mode", observed=True, sort=sort)]
        got = split(frame, "mode", sort=sort)
        assert [k for k, _ in got] == [k for k, _ in want]
        for (_, g), (_, w) in zip(got, want):
            pd.testing.assert_frame_equal(g, w)
        for (_, g), (_, w) in zip(split(frame, "mode", ["x"], sort=sort), want):
            pd.testing.assert_frame_equal(g, w[["x"]])
    if one and n:
        (_, whole), = split(frame, "mode")
        whole["x"] = 0.0  # a group's changes stay its own
        assert frame["x"].sum() > 0


def _steps_like(rng, contiguous: bool) -> pd.DataFrame:
    """A steps-shaped frame: processes (categorical, some categories unused or in another
    order), ranks with missing ones, modes, threads; the processes' rows together or not."""
    n = int(rng.integers(0, 400))
    names = ["rank1", "rank0", "worker", "unused"]
    process = rng.integers(0, 3, n)
    if contiguous:
        process = np.sort(process)[::-1] if rng.random() < 0.3 else np.sort(process)
    rank = pd.array(process if rng.random() < 0.5 else rng.integers(0, 2, n), dtype="Int64")
    rank[rng.random(n) < (0.5 if rng.random() < 0.3 else 0.0)] = pd.NA
    mode = pd.Categorical(rng.choice(["train", "eval"] if rng.random() < 0.5 else ["train"], n))
    return pd.DataFrame({"process": pd.Categorical.from_codes(process, names), "rank": rank, "mode": mode,
                         "tid": rng.integers(0, 2, n), "x": rng.random(n)}, index=np.arange(n) + 11)


@pytest.mark.parametrize("seed", range(12))
def test_groups_equal_pandas_groupby_and_slices_stay_their_own(seed):
    """frames.groups gives ``groupby(keys, dropna=False, sort=True, observed=True)``'s groups
    (keys, order, rows, index), whether or not each process's rows come together (where they
    do, in slices); split's slices too; and a group changed leaves the table as it was."""
    from stepscope.analysis.store.frames import groups, split

    rng = np.random.default_rng(seed)
    for contiguous in (True, False):
        frame = _steps_like(rng, contiguous)
        for keys in (["process", "rank"], ["process", "rank", "mode"], ["process", "tid"], ["process"]):
            want = list(frame.groupby(keys, dropna=False, sort=True, observed=True))
            for columns in (None, ["x", "mode"]):
                got = groups(frame, keys, columns)
                assert [str(k) for k, _ in got] == [str(k) for k, _ in want]
                for (_, g), (_, w) in zip(got, want):
                    pd.testing.assert_frame_equal(g, w if columns is None else w[columns])
        for sort in (False, True):
            want = list(frame.groupby("process", observed=True, sort=sort))
            got = split(frame, "process", sort=sort)
            assert [k for k, _ in got] == [k for k, _ in want]
            for (_, g), (_, w) in zip(got, want):
                pd.testing.assert_frame_equal(g, w)
        before = frame.copy()
        for _, g in groups(frame, ["process", "rank"]) + split(frame, "process"):
            g["x"] = -1.0  # a group's changes stay its own
            g.loc[g.index[:1], "tid"] = 99
        pd.testing.assert_frame_equal(frame, before)
