"""tf.data: custom loops over a Dataset (eager step, tf.function step) get steps and GetNext."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

import stepscope

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
