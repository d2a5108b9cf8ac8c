"""Loops one after another in one process (SPEC §3, issue 58): a second model, k-fold, a
second Keras fit. Each loop's steps are numbered as such, the summary shows each loop, and
the rules judge each loop apart: a model built between loops is no leak, a later loop's
other step time no outlier."""

import json
import os
import subprocess
import sys

import pytest

import stepscope
from stepscope.analysis.loops import loop_numbers, step_loops
from stepscope.core.vocabulary import END_OF_DATA

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "sequential_loops.py")


def run_job(tmp_path, kind, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"), **env_extra)
    r = subprocess.run([sys.executable, "-m", "stepscope", "run", "--name", kind, "--", sys.executable, SCRIPT, kind],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and f"done {kind}" in r.stdout, r.stderr[-3000:]
    s = subprocess.run([sys.executable, "-m", "stepscope", "summary", kind, "--json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert s.returncode == 0, s.stderr
    return json.loads(s.stdout), stepscope.load(tmp_path / "runs" / kind), r.stderr


@pytest.mark.slow
def test_a_second_model_is_a_second_loop_not_a_leak_or_outliers(tmp_path):
    """A small model trained 100 steps, then a larger one built with a 600 MB table and
    trained 30 slower steps. Judged as one loop (before), that was a host-memory leak "used
    up in 3 min" and 27 outlier steps; judged per loop it is a healthy script."""
    s, run, printed = run_job(tmp_path, "twomodels")
    assert s["findings"] == [], s["findings"]
    loops = s["loops"]
    assert [(b["loop"], b["steps"]) for b in loops] == [(0, {"train": 100}), (1, {"train": 30})]
    assert loops[1]["train_median_ms"] > 1.5 * loops[0]["train_median_ms"]
    assert "2 loops, one after another" in printed
    numbers = step_loops(run)
    assert run.steps["loop"].tolist() == numbers.tolist()  # the steps table carries each step's loop
    assert set(loops[0]["phases"]) >= {"Forward", "Backward", "Optimizer", "Other"}
    assert loops[1]["phases"]["Other"] > 0.5  # the larger model's steps: mostly its 100 ms sleep
    steps = run.steps.sort_values("start_ns")
    assert numbers.reindex(steps.index).tolist() == [0] * 100 + [1] * 30
    # the larger model's build is between the loops, in no step: the first loop's last step is
    # no longer than its typical step, and the build did not land in the next loop's first step
    first = steps[numbers.reindex(steps.index) == 0]["duration_ns"]
    assert first.iloc[-1] < 3 * first.median()
    assert s["between_loops"]["total_ms"] > 50  # the 600 MB table's allocation, at least


@pytest.mark.slow
def test_k_fold_is_a_loop_per_fold(tmp_path):
    s, run, _ = run_job(tmp_path, "kfold")
    assert [b["steps"] for b in s["loops"]] == [{"train": 40}] * 4
    assert s["steps"]["train"]["count"] == 160
    assert not [f for f in s["findings"] if f["rule"] in ("StepOutlier", "HostMemoryIncrease")], s["findings"]


@pytest.mark.slow
def test_two_keras_fits_are_two_loops(tmp_path):
    pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    s, run, _ = run_job(tmp_path, "keras", KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    assert [b["steps"] for b in s["loops"]] == [{"train": 60}, {"train": 60}]
    assert not [f for f in s["findings"] if f["rule"] in ("StepOutlier", "HostMemoryIncrease")], s["findings"]


@pytest.mark.slow
def test_tensorflow_custom_loops_one_after_another(tmp_path):
    """A custom TF loop, then a new model and a new Keras optimizer: the optimizer's making
    begins the second loop, as a torch optimizer's does."""
    pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    s, run, _ = run_job(tmp_path, "tfcustom", KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    assert [b["steps"] for b in s["loops"]] == [{"train": 76}, {"train": 76}]
    assert not [f for f in s["findings"] if f["rule"] in ("StepOutlier", "HostMemoryIncrease")], s["findings"]


@pytest.mark.slow
def test_keras_mirrored_fit_of_unknown_length_counts_its_steps_and_finds_nothing(tmp_path):
    """Under MirroredStrategy over tf.data of unknown length, each epoch ends in a call that
    meets the end of the data. That call began a step (before: 17 train steps an epoch for 16,
    and its last step an outlier in every epoch); it is no step now, and its time is the
    epoch's end."""
    pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    s, run, _ = run_job(tmp_path, "mirrored", KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    assert s["steps"]["train"]["count"] == 160 and s["steps"]["eval"]["count"] == 40
    assert s["findings"] == [], s["findings"]
    steps = run.steps
    for mode, n in (("train", 160), ("eval", 40)):  # numbered without gaps
        assert sorted(steps[steps["mode"] == mode]["step"]) == list(range(n))
    ends = run.events[run.events["name"] == END_OF_DATA]
    assert len(ends) == 20  # one per epoch and one per validation
    train = steps[steps["mode"] == "train"].sort_values("start_ns")
    last = train.groupby(train["step"] // 16).tail(1)
    for end in ends["start_ns"]:  # each is after its loop's last step, in no step
        assert not ((steps["start_ns"] < end) & (steps["end_ns"] > end)).any()
    assert (last["duration_ns"] < 3 * train["duration_ns"].median()).mean() >= 0.8


@pytest.mark.slow
def test_the_loaders_last_call_is_after_the_loop(tmp_path):
    """The fetch that meets a DataLoader's end (2 workers shut down) was its loop's last
    step's; now each epoch's last step ends where that call began, and the call is named."""
    s, run, _ = run_job(tmp_path, "epochloader")
    assert s["steps"]["train"]["count"] == 120
    ends = run.events[run.events["name"] == END_OF_DATA].sort_values("start_ns")
    assert len(ends) == 6
    train = run.steps[run.steps["mode"] == "train"].sort_values("start_ns")
    last = train.groupby(train["step"] // 20).tail(1)
    assert last["end_ns"].tolist() == ends["start_ns"].tolist()
    assert "end of data" in s["between_loops"]["largest"], s["between_loops"]


def test_a_void_mark_turns_its_step_into_an_end():
    """``voided``: a void mark's step begin (its process, thread and number, begun by then)
    reads as an end mark, as the void mark itself; other threads' steps stay."""
    import pandas as pd

    from stepscope.analysis.tables.stepping import voided
    from stepscope.core.vocabulary import END_MARK, VOID_MARK

    names = ["train", "train", "train", VOID_MARK, "train", "train"]
    ev = pd.DataFrame({"process": pd.Categorical(["p"] * 6), "tid": [1, 1, 2, 1, 1, 2],
                       "kind": pd.Categorical(["instant"] * 6), "category": pd.Categorical(["step"] * 6),
                       "name": pd.Categorical(names),
                       "start_ns": [0, 10, 12, 15, 20, 25], "arg": [0, 1, 1, 1, 1, 2]})
    out = voided(ev)
    assert out["name"].astype(str).tolist() == ["train", END_MARK, "train", END_MARK, "train", "train"]
    assert out["arg"].tolist() == [0, 0, 1, 0, 1, 2]
    assert ev["name"].astype(str).tolist() == names  # the frame given is left as it was


def test_loop_numbers_from_marks_and_an_optimizer_made_every_iteration():
    """Steps take the number of their process's marks before them; where the loops would hold
    fewer than MIN_LOOP_STEPS train steps each (an optimizer made in every iteration, as
    meta-learning inner loops do), the process has one loop."""
    import pandas as pd

    steps = pd.DataFrame({"process": ["a"] * 6 + ["b"] * 40, "mode": ["train"] * 46,
                          "start_ns": list(range(0, 60, 10)) + list(range(0, 400, 10))})
    marks = pd.DataFrame({"process": ["a", "a"] + ["b"] * 14, "start_ns": [25, 25] + list(range(5, 400, 30))})
    got = loop_numbers(steps, marks)
    assert got.tolist()[:6] == [0, 0, 0, 1, 1, 1]  # two marks with no step between: one edge
    assert set(got.tolist()[6:]) == {0}  # b: a mark every 3 steps
