"""The time between a thread's loops, named by the modes around it (analysis/loop_edges.py)."""

import pandas as pd

from stepscope.analysis.loop_edges import BETWEEN, EPOCH_END, VALIDATION_START, intervals


def _steps(rows):
    return pd.DataFrame([{"process": "p", "tid": 1, "mode": m, "start_ns": a, "end_ns": b} for m, a, b in rows])


def test_intervals_are_named_by_the_steps_around_them():
    steps = _steps([("eval", 0, 10),  # a dry run, then setup until the loop
                    ("train", 50, 60), ("train", 60, 70),  # contiguous: no interval
                    ("eval", 75, 80), ("eval", 80, 90),  # validation start-up before it
                    ("train", 120, 130), ("interrupted", 130, 140),  # an epoch's end before it
                    ("eval", 150, 160)])
    got = intervals(steps)
    assert list(zip(got["kind"], got["start_ns"], got["end_ns"])) == [
        (BETWEEN, 10, 50), (VALIDATION_START, 70, 75), (EPOCH_END, 90, 120), (VALIDATION_START, 140, 150)]


def test_each_thread_has_its_own_intervals():
    steps = pd.concat([_steps([("train", 0, 10), ("train", 20, 30)]),
                       _steps([("train", 5, 25)]).assign(tid=2)], ignore_index=True)
    got = intervals(steps)
    assert list(zip(got["tid"], got["kind"], got["start_ns"])) == [(1, EPOCH_END, 10)]
