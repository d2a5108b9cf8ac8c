"""An iteration that ends without its optimizer step (an exception, Ctrl-C) is kept on
the timeline as an interrupted step and counted as no train step (SPEC §3, issue 47
item 7): real loops under STEPSCOPE=1, the truth printed by the script."""

import json
import os
import subprocess
import sys

import pytest

from test_torch import SCRIPTS, _env

torch = pytest.importorskip("torch")

import stepscope  # noqa: E402
from stepscope.analysis.report.summary import format_text, summarize  # noqa: E402

SCRIPT = os.path.join(SCRIPTS, "interrupted.py")


def _run(tmp_path, kind, exit_code=0):
    env = _env(tmp_path, STEPSCOPE_RUN=kind, STEPSCOPE="1")
    r = subprocess.run([sys.executable, SCRIPT, kind], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == exit_code, r.stderr[-3000:]
    assert "stepscope:" not in r.stderr, r.stderr[-3000:]
    truth = int(r.stdout.split("optimizer steps")[1].split()[0]) if "optimizer steps" in r.stdout else None
    return truth, stepscope.load(str(tmp_path / "runs" / kind))


@pytest.mark.parametrize("kind,exit_code,done", [("ctrl_c", 0, 5), ("forward_raises", 1, 5),
                                                 ("backward_raises", 1, 5)])
def test_an_interrupted_iteration_is_no_train_step(tmp_path, kind, exit_code, done):
    truth, run = _run(tmp_path, kind, exit_code)
    assert truth in (None, done)
    steps = run.steps.sort_values("start_ns")
    assert steps.groupby("mode", observed=True).size().to_dict() == {"train": done, "interrupted": 1}
    last = steps.iloc[-1]
    assert last["mode"] == "interrupted" and last["step"] == done  # numbered as it began, after the others
    # its time is real and stays on the timeline: the 50 ms before the failure, contiguous with the steps
    assert last["duration_ns"] >= 50e6, last["duration_ns"]
    assert last["start_ns"] == steps.iloc[-2]["end_ns"]
    assert last["Forward"] > 0 and last["Optimizer"] == 0
    if kind == "backward_raises":
        assert last["Backward"] > 0 or last["Other"] > 0

    s = summarize(run)
    assert s["steps"]["train"]["count"] == done and set(s["steps"]) == {"train"}
    assert s["interrupted"]["count"] == 1 and s["interrupted"]["total_ms"] >= 50
    # step statistics and phase shares are the train steps' alone, not the interrupted one's
    train = steps.loc[steps["mode"] == "train", "duration_ns"]
    # (to the summary's 3 decimals: NumPy's round of a half-way 2.8895 gives 2.89, Python's 2.889)
    assert s["steps"]["train"]["max_ms"] == pytest.approx(train.max() / 1e6, abs=6e-4), s["steps"]["train"]
    assert s["steps"]["train"]["mean_ms"] == pytest.approx(train.mean() / 1e6, abs=6e-4), s["steps"]["train"]
    train_ms = train.sum() / 1e6
    assert abs(s["phases"]["Forward"]["total_ms"] / train_ms - s["phases"]["Forward"]["share"]) < 1e-3
    assert "1 interrupted step(s)" in format_text(s)
    assert json.loads(json.dumps(s))["interrupted"]["count"] == 1  # (summary --json prints this dict)


@pytest.mark.slow
def test_report_and_diff_say_so(tmp_path):
    """The report's job summary and ``stepscope diff`` name the interrupted step too."""
    from stepscope.analysis.report.diff import diff
    from stepscope.analysis.report.page import _job_summary

    _, run = _run(tmp_path, "ctrl_c")
    _, clean = _run(tmp_path, "skip_bad_batch")
    html = _job_summary(run, summarize(run))
    assert "interrupted steps" in html and "1 (" in html.split("interrupted steps")[1][:40]
    rows = {r["metric"]: r for r in diff(clean, run)["rows"]}
    assert (rows["interrupted steps"]["a"], rows["interrupted steps"]["b"]) == (0, 1)


def test_a_skipped_batch_joins_the_iteration_that_steps(tmp_path):
    """A loop that catches a bad batch's error and goes on: the failed forward's time is
    part of the next iteration, which steps; 7 train steps, none interrupted."""
    truth, run = _run(tmp_path, "skip_bad_batch")
    assert truth == 7
    assert run.steps.groupby("mode", observed=True).size().to_dict() == {"train": 7}
    assert (run.steps["Optimizer"] > 0).all()


def test_no_step_is_flagged_in_a_loop_whose_completion_never_showed(tmp_path):
    """Train-mode forwards with no backward or optimizer step stepscope sees (nothing
    completes a step): no interruption to flag; the loop notes speak for such a run."""
    from test_torch import run_script

    script = tmp_path / "forwards.py"
    script.write_text("import torch\nm = torch.nn.Linear(4, 4)\n"
                      "for _ in range(5):\n    m(torch.randn(2, 4)).sum()\nprint('ok')\n")
    run_script(tmp_path, str(script), name="forwards")
    run = stepscope.load(str(tmp_path / "runs" / "forwards"))
    assert "interrupted" not in set(run.steps["mode"])


def test_native_interrupt_step_flags_the_open_step(tmp_path):
    """``_native.interrupt_step()``: the mechanism for integrations that mark steps
    themselves (Keras's callback): it flags the calling thread's open step, and a reader
    gives that step, and no other, the mode interrupted."""
    from stepscope.core import _native

    with stepscope.profile(dir=str(tmp_path), name="hand", gpu="off") as _:
        assert not _native.interrupt_step()  # no step open
        for i in range(3):
            _native.begin_step("train", 0)
        assert _native.interrupt_step()
        _native.end_step(0)
    steps = stepscope.load(str(tmp_path / "hand")).steps.sort_values("start_ns")
    assert steps["mode"].tolist() == ["train", "train", "interrupted"]
    assert steps["step"].tolist() == [0, 1, 2]


LEFT = os.path.join(SCRIPTS, "left_loops.py")


@pytest.mark.parametrize("kind,train,interrupted", [("caught", 5, 1), ("break", 5, 1), ("inner_loader", 6, 0)])
def test_a_loop_left_mid_iteration_ends_there_and_the_evaluation_after_it_is_counted(tmp_path, kind, train,
                                                                                      interrupted):
    """A train loop left after a fetch (an exception caught outside it, a break) leaves its
    step unfinished: the evaluation after it is its own steps, not part of that step. An
    iteration that reads a loader of its own stays one train step."""
    env = _env(tmp_path, STEPSCOPE_RUN=kind, STEPSCOPE="1")
    r = subprocess.run([sys.executable, LEFT, kind], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "stepscope:" not in r.stderr, r.stderr[-3000:]
    words = r.stdout.split()
    assert int(words[2]) == train and int(words[5]) == 4, r.stdout
    steps = stepscope.load(str(tmp_path / "runs" / kind)).steps.sort_values("start_ns")
    counts = steps.groupby("mode", observed=True).size().to_dict()
    assert counts == {"train": train, "eval": 4, **({"interrupted": 1} if interrupted else {})}, counts
    if interrupted:
        cut = steps[steps["mode"] == "interrupted"].iloc[0]
        first_eval = steps[steps["mode"] == "eval"].iloc[0]
        assert cut["end_ns"] <= first_eval["start_ns"]
        assert cut["duration_ns"] < first_eval["start_ns"] - steps.iloc[0]["start_ns"]
