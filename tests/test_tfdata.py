"""tf.data: custom loops over a Dataset (eager step, tf.function step) get steps and GetNext."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

import stepscope
from stepscope.analysis.report.summary import summarize

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "tfdata_loops.py")


@pytest.mark.parametrize("how", ["api", "plain"])
def test_eager_and_tf_function_loops(tmp_path, how):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN="d", TF_CPP_MIN_LOG_LEVEL="3")
    if how == "plain":
        env["STEPSCOPE"] = "1"
    r = subprocess.run([sys.executable, SCRIPT, how], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-3000:]
    assert "stepscope:" not in r.stderr, r.stderr[-3000:]
    run = stepscope.load(tmp_path / "runs" / "d")
    steps = run.steps.sort_values("start_ns")
    # 12 batches of the eager loop, then 10 of the tf.function loop
    assert steps.groupby("mode", observed=True).size().to_dict() == {"train": 22}
    assert list(steps["step"]) == list(range(22))
    assert (steps["GetNext"] > 0).all()
    assert (steps["GetNext"] < steps["duration_ns"]).all()
    ev = run.events
    getnext = ev[(ev["category"] == "phase") & (ev["name"] == "GetNext") & (ev["kind"] == "span")]
    assert len(getnext) == 22  # the end-of-data fetches are no GetNext
    # each step runs from its fetch to the next fetch: steps are contiguous within a loop
    gaps = steps["start_ns"].to_numpy()[1:] - steps["end_ns"].to_numpy()[:-1]
    assert (gaps >= 0).all()
    assert (gaps[:11] == 0).all() and (gaps[12:] == 0).all()


UNFED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "tf_unfed_loops.py")


def _run_unfed(tmp_path, optimizers, profiled):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3")
    if profiled:
        env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN=optimizers)
    r = subprocess.run([sys.executable, UNFED, optimizers], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stepscope:" not in r.stderr, r.stderr[-3000:]
    return r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("optimizers", ["keras", "v1"])
def test_a_loop_no_fetch_drives_has_a_step_per_optimizer_step(tmp_path, optimizers):
    """Issue 81: the train step eager, a tf.function or jit-compiled, its batches from a
    generator, a list or tf.data, the optimizer Keras 3, tf.keras or tf.compat.v1: one train
    step per iteration, as the script's own counters say; the output is the plain run's."""
    profiled = _run_unfed(tmp_path, optimizers, True)
    assert profiled == _run_unfed(tmp_path, optimizers, False)  # the same losses
    loops = [(line.split()[1], int(line.split()[3])) for line in profiled.splitlines() if line.startswith("loop ")]
    run = stepscope.load(tmp_path / "runs" / optimizers, quiet=True)
    steps = run.steps.sort_values("start_ns").reset_index(drop=True)
    assert set(steps["mode"]) == {"train"} and len(steps) == sum(n for _, n in loops), (loops, len(steps))
    at = 0
    for shape, n in loops:
        mine = steps.iloc[at:at + n]
        at += n
        kind, data = shape.split("-")[0], shape.split("-")[-1]
        # only a tf.data fetch is GetNext; only an eager apply_gradients is a phase of its own
        assert (mine["GetNext"] > 0).all() if data == "tfdata" else (mine["GetNext"] == 0).all(), shape
        assert (mine["Optimizer"] > 0).all() if kind == "eager" else (mine["Optimizer"] == 0).all(), shape
        assert (mine[["Forward", "Backward"]] == 0).all().all(), shape
        gaps = mine["start_ns"].to_numpy()[1:] - mine["end_ns"].to_numpy()[:-1]
        assert (gaps == 0).all(), shape  # each step runs to the next one's start
    notes = " ".join(run.info.get("notes") or [])
    assert "no tf.data fetch drives" in notes
    assert summarize(run)["loop_notes"] == []  # (no "nothing recorded", no PyTorch advice on a forward)
