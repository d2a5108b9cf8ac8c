"""Hugging Face Trainer: one train step per optimizer step, zero edits or the callback."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import stepscope

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "hf_trainer.py")


def _run(tmp_path, how, *args, profiled=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN="hf", TRANSFORMERS_VERBOSITY="error")
    if profiled and how == "plain":
        env["STEPSCOPE"] = "1"
    r = subprocess.run([sys.executable, SCRIPT, how, *args], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stepscope:" not in r.stderr, r.stderr[-3000:]
    return r


@pytest.mark.slow
@pytest.mark.parametrize("how,accum", [("plain", 1), ("plain", 2), ("callback", 2), ("plain", 3)])
def test_one_train_step_per_optimizer_step(tmp_path, how, accum):
    plain = _run(tmp_path / "p", how, str(accum), profiled=False) if (tmp_path / "p").mkdir() is None else None
    r = _run(tmp_path, how, str(accum))
    result = [ln for ln in r.stdout.splitlines() if ln.startswith("global_step")]
    assert result == [ln for ln in plain.stdout.splitlines() if ln.startswith("global_step")]  # same results
    optimizer_steps = int(r.stdout.split("global_step")[1].split()[0])
    assert optimizer_steps == 2 * -(-12 // accum)  # 12 batches an epoch, the last window may be short
    steps = stepscope.load(str(tmp_path / "runs" / "hf")).steps
    assert steps.groupby("mode").size().to_dict() == {"train": optimizer_steps}
    assert (steps[["GetNext", "Forward", "Backward", "Optimizer"]] > 0).all().all()


def test_evaluation_during_training_is_eval_steps(tmp_path):
    r = _run(tmp_path, "plain", "2", "eval")
    steps = stepscope.load(str(tmp_path / "runs" / "hf")).steps
    # 2 epochs x 6 optimizer steps; 2 evaluations x 2 batches of 16
    assert steps.groupby("mode").size().to_dict() == {"train": 12, "eval": 4}, r.stdout
    assert (steps[steps["mode"] == "eval"]["Forward"] > 0).all()
