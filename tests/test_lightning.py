"""Lightning: the callback, zero edits, the user's own profiler, no sanity-check steps."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("lightning")

import stepscope
from stepscope.core.vocabulary import PHASES

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "lightning_fit.py")


def _failure(stderr: str) -> str:
    """What a failed run printed: its end, and before it every line of another rank or of a
    crash (the other rank's lines come first, and a crash's C-level cause in faulthandler's)."""
    lines = stderr.splitlines()
    marks = ("[rank1]", "Fatal Python error", "terminate called", "Segmentation", "Aborted", "stepscope:")
    early = [ln for ln in lines[:-40] if any(m in ln for m in marks)]
    return "\n".join(early[-60:] + ["..."] + lines[-40:])


def _run(tmp_path, *args, zero_edit=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN="lt", PYTHONFAULTHANDLER="1")
    if zero_edit:
        env["STEPSCOPE"] = "1"
    r = subprocess.run([sys.executable, SCRIPT, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, _failure(r.stderr)
    assert "stepscope:" not in r.stderr, r.stderr[-3000:]
    assert ("fitted 20" if "ddp" in args else "fitted 40") in r.stdout
    return r, stepscope.load(tmp_path / "runs" / "lt")


def _check(run):
    steps = run.steps
    # 20 batches x 2 epochs of training; 10 validation batches x 2 epochs, sanity check not counted
    assert steps.groupby("mode", observed=True).size().to_dict() == {"eval": 20, "train": 40}
    train = steps[steps["mode"] == "train"]
    assert (train[["GetNext", "Forward", "Backward", "Optimizer"]] > 0).all().all()
    shares = steps[list(PHASES)].sum(axis=1) / steps["duration_ns"]
    assert (shares <= 1 + 1e-9).all()
    names = set(run.events[run.events["category"] == "framework"]["name"].astype(str))
    assert "run_training_batch" in names and any(n.startswith("[Strategy]") for n in names)


def test_callback(tmp_path):
    _, run = _run(tmp_path, "callback")
    _check(run)


@pytest.mark.slow
def test_zero_edit(tmp_path):
    _, run = _run(tmp_path, "plain", zero_edit=True)
    _check(run)


# ("simple" and "advanced": tests/conformance/lightning_profiler_*.py compare their rows exactly)
@pytest.mark.slow
@pytest.mark.parametrize("profiler", ["pytorch", "recording"])
def test_users_profiler_sees_exactly_its_usual_calls(tmp_path, profiler):
    """Trainer(profiler=...) of the user's own: same report, same calls, no crash."""
    plain = subprocess.run([sys.executable, SCRIPT, "plain", profiler], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")})
    assert plain.returncode == 0, plain.stderr[-2000:]
    for how in ("callback", "zero-edit"):
        (tmp_path / how).mkdir()
        r, run = _run(tmp_path / how, "callback" if how == "callback" else "plain", profiler,
                      zero_edit=how == "zero-edit")
        _check(run)
        out, base = r.stdout + r.stderr, plain.stdout + plain.stderr
        assert "StepscopeCallback" not in out
        if profiler == "recording":
            calls = [ln for ln in out.splitlines() if ln.startswith("calls")]
            assert calls == [ln for ln in base.splitlines() if ln.startswith("calls")]
        else:
            report = out[out.index("Profiler Report"):]
            plain_report = base[base.index("Profiler Report"):]
            # same rows (their timings differ): within a fifth of the plain report's length
            assert abs(len(report) - len(plain_report)) < 0.2 * len(plain_report), (len(report), len(plain_report))


@pytest.mark.slow
def test_ddp_two_processes_one_run(tmp_path):
    _, run = _run(tmp_path, "callback", "ddp")
    procs = run.processes
    assert sorted(procs["process"].str.rsplit("-", n=1).str[1]) == ["rank0", "rank1"]
    steps = run.steps
    # each rank trains on half of the 20 batches per epoch and validates half of 10
    assert steps.groupby(["rank", "mode"], observed=True).size().to_dict() == {
        (0, "eval"): 10, (0, "train"): 20, (1, "eval"): 10, (1, "train"): 20}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lightning", "torch"])
def test_epoch_edges_are_named_intervals_not_outliers(tmp_path, kind):
    """Issue 47 item 3: validation start-up and an epoch's end (60 ms each here) are no
    last step's Other (StepOutlier reported every epoch's last step of a healthy fit):
    the loops' steps and the between-loops intervals the summary names cover the loop,
    with the intervals' time per epoch; no finding."""
    from stepscope.analysis.loop_edges import EPOCH_END, VALIDATION_START, intervals
    from stepscope.analysis.report.summary import format_text, summarize

    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN="edges", STEPSCOPE="1")
    script = os.path.join(os.path.dirname(SCRIPT), "epoch_edges.py")
    r = subprocess.run([sys.executable, script, kind], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, _failure(r.stderr)
    loop_ns = int(r.stdout.split("loop_ns")[1].split()[0])
    run = stepscope.load(tmp_path / "runs" / "edges")
    s = summarize(run)
    assert {m: st["count"] for m, st in s["steps"].items()} == {"train": 64, "eval": 32}
    assert not [f for f in s["findings"] if f["rule"] == "StepOutlier"], s["findings"]
    edges = s["between_loops"]
    assert edges["epochs"] == 4
    assert edges["parts"][VALIDATION_START] >= 55, edges  # 60 ms a validation
    assert edges["parts"][EPOCH_END] >= 0.75 * 55, edges  # 60 ms at 3 of 4 epochs' ends, before the next
    assert "between loops" in format_text(s)
    steps = run.steps.sort_values("start_ns")
    gaps = intervals(steps)
    covered = steps["duration_ns"].sum() + (gaps["end_ns"] - gaps["start_ns"]).sum()
    span = steps["end_ns"].max() - steps["start_ns"].min()
    assert covered >= 0.999 * span  # every moment is a step or a named interval
    assert span >= 0.9 * loop_ns - 2 * 60e6, (span, loop_ns)  # (the last epoch's end is after the loop)
    # the last step of each pass (the one an interval follows) is as long as the others:
    # no epoch edge in it
    last = steps[steps["end_ns"].isin(gaps["start_ns"])]
    assert len(last) >= 2 * 4 - 1, last
    for mode, ends in last.groupby("mode", observed=True)["duration_ns"]:
        median = steps.loc[steps["mode"] == mode, "duration_ns"].median()
        assert ends.max() < median + 40e6, (mode, ends.max() / 1e6, median / 1e6)
