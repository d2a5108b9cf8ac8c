"""The summary and the report say when stepscope did not understand the loop (issue 22):
steps it could not delimit, and a run that recorded nothing. Real jobs under `stepscope run`
(tests/scripts/loop_jobs.py)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from stepscope.core.vocabulary import REPORT_FILE

JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "loop_jobs.py")


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"))
    return env


def run_job(tmp_path, kind, code=0, script=None):
    """Runs the job under `stepscope run`; returns (summary --json, summary text, report html)."""
    env = _env(tmp_path)
    job = [script] if script else [JOBS, kind]
    r = subprocess.run([sys.executable, "-m", "stepscope", "run", "--name", kind, "--", sys.executable, *job],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == code, r.stderr[-3000:]
    s = subprocess.run([sys.executable, "-m", "stepscope", "summary", kind, "--json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert s.returncode == 0, s.stderr
    report = (tmp_path / "runs" / kind / REPORT_FILE).read_text()  # written by `stepscope run`
    return json.loads(s.stdout), r.stderr, report


@pytest.mark.slow
def test_a_loop_without_backward_or_optimizer_says_steps_could_not_be_delimited(tmp_path):
    s, printed, report = run_job(tmp_path, "zeroth")
    assert s["steps"]["train"]["count"] == 1  # 150 iterations recorded as one step
    (note,) = s["loop_notes"]
    assert note["key"] == "steps_not_delimited" and note["severity"] == "warning"
    (p,) = note["evidence"]["processes"]
    assert p["train_steps"] == 1 and p["step"] == 0
    assert p["forwards"] == 300  # two forwards per iteration, all in that one step
    assert p["why"] == ["forwards_piled_up", "one_long_step"]
    assert p["share_of_profiled"] > 0.5 and p["duration_ms"] >= 150 * 30  # the whole loop
    assert "300 forward passes" in note["message"]
    assert "stepscope.step() at the top of each iteration" in note["recommendation"]
    assert "stepscope.phase(" in note["recommendation"]
    # the text `stepscope run` printed, and the report's verdict
    assert "note [steps_not_delimited]: Steps could not be delimited" in printed
    assert 'id="note-steps_not_delimited"' in report and "Steps could not be delimited" in report


@pytest.mark.slow
def test_marking_the_iterations_delimits_them(tmp_path):
    s, printed, _ = run_job(tmp_path, "zeroth_marked")
    assert s["loop_notes"] == [], s["loop_notes"]
    # 150 marks: once the program marks steps, the integrations record phases only
    assert s["steps"]["train"]["count"] == 150
    assert s["steps"]["train"]["median_ms"] >= 30  # each iteration sleeps 30 ms
    assert s["phases"]["Forward"]["count"] == 150
    assert "note [" not in printed


@pytest.mark.slow
def test_a_normal_run_has_no_note(tmp_path):
    s, printed, report = run_job(tmp_path, "normal")
    assert s["steps"]["train"]["count"] == 40
    assert s["loop_notes"] == []
    assert "note [" not in printed and "finding loop-note" not in report


def test_a_forward_outside_every_module_is_named_as_unseen(tmp_path):
    """Plain tensor code (`xb @ weights + bias`) with a backward and a hand-made update:
    24 right steps, each with a Backward and no Forward; the note says where the
    forward's time went and how to see it."""
    s, printed, report = run_job(tmp_path, "scratch")
    assert s["steps"]["train"]["count"] == 24
    assert "Forward" not in s["phases"] and s["phases"]["Backward"]["count"] == 24
    (note,) = s["loop_notes"]
    assert note["key"] == "forward_not_seen" and note["evidence"]["train_steps"] == 24
    assert "outside every torch.nn.Module" in note["message"] and "Other" in note["message"]
    assert "stepscope.phase(\"Forward\")" in note["recommendation"]
    assert "note [forward_not_seen]" in printed and 'id="note-forward_not_seen"' in report


def test_a_run_that_stopped_before_its_loop_says_nothing_was_recorded(tmp_path):
    s, printed, report = run_job(tmp_path, "fails", code=1)
    assert s["steps"] == {} and s["phases"] == {}
    (note,) = s["loop_notes"]
    assert note["key"] == "nothing_recorded"
    assert note["evidence"]["frameworks"] == ["PyTorch"] and note["evidence"]["ended"] is True
    assert note["evidence"]["duration_s"] > 0
    assert "stopped before its training loop began" in note["message"]
    assert "FileNotFoundError" in printed  # the job's own error went through
    assert "note [nothing_recorded]: Nothing was recorded" in printed
    assert 'id="note-nothing_recorded"' in report


@pytest.mark.slow
def test_a_tensorflow_loop_of_its_own_is_named_as_the_cause(tmp_path):
    """A tf.function step fed NumPy slices (no tf.data, no Keras fit, its variables updated
    by hand) ran to its end: the note names that kind of loop, not an early exit, says what
    stepscope saw (the function traced, its calls) and how to mark it."""
    pytest.importorskip("tensorflow")
    script = os.path.join(os.path.dirname(JOBS), "tf_own_loop.py")
    s, printed, _ = run_job(tmp_path, "tf_own", script=script)
    assert s["steps"] == {}
    (note,) = s["loop_notes"]
    assert note["key"] == "nothing_recorded" and "TensorFlow" in note["evidence"]["frameworks"]  # tf.keras brings Keras
    assert "a loop that updates its variables another way (by hand" in note["message"]
    assert note["evidence"]["tf_functions_traced"]["functions"] == ["train_step"]
    assert "it traced the tf.function(s) train_step (1 trace(s))" in note["message"]
    assert "tf.function calls train_step (12x) ran eagerly" in printed  # the integration's own note
    assert "stopped before its training loop began" not in note["message"]
    assert "stepscope.step() at the top of each iteration" in note["recommendation"]
    assert "note [nothing_recorded]" in printed
