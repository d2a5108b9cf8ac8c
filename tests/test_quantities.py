"""One number per quantity: the summary, the report and the rules take their figures from
stepscope.analysis.quantities, and analysis/ stands on its own below the command line."""

import ast
import os

import pytest

from conftest import REPO


def _imports(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_analysis_imports_nothing_from_the_command_line():
    offenders = []
    for root, _, files in os.walk(os.path.join(REPO, "analysis")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                offenders += [f"{name}: {m}" for m in _imports(path) if m.startswith("stepscope.cli")]
    assert not offenders, offenders


def test_summary_and_diff_live_in_analysis_alone():
    """One home each (issue 42): the command line has no copies or re-exports of them."""
    import importlib.util

    from stepscope.analysis.report.diff import diff, format_diff  # noqa: F401
    from stepscope.analysis.report.summary import format_text, summarize  # noqa: F401

    assert importlib.util.find_spec("stepscope.cli.diff") is None
    assert importlib.util.find_spec("stepscope.cli.summary") is None


# --- real runs ----------------------------------------------------------------------------
EPOCHS = os.path.join(REPO, "tests", "scripts", "epochs.py")


def _epochs_run(tmp_path, name, *args):
    """tests/scripts/epochs.py under STEPSCOPE=1 (an unmodified PyTorch job), loaded."""
    import subprocess
    import sys

    import stepscope

    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN=name)
    r = subprocess.run([sys.executable, EPOCHS, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-3000:]
    return stepscope.load(tmp_path / "runs" / name, quiet=True)


def _finding(summary, rule):
    (f,) = [f for f in summary["findings"] if f["rule"] == rule]
    return f


def test_getnext_finding_quotes_the_summarys_share(tmp_path):
    """The summary once said GetNext was 74.2% of train step time and GetNextBottleneck 79%
    (it left each rank's first step out). Both now come from quantities.phase_shares."""
    pytest = __import__("pytest")
    pytest.importorskip("torch")
    from stepscope.analysis.quantities import percent
    from stepscope.analysis.report.summary import format_text, summarize

    # one epoch, 5 ms of host work a step: the loop waits ~10 ms a step for its 2 workers
    # (with 10 ms it waited ~5 ms, and under load the steady wait fell below the threshold)
    run = _epochs_run(tmp_path, "share", "1", "plain", "2", "5")
    s = summarize(run)
    share = s["phases"]["GetNext"]["share"]
    f = _finding(s, "GetNextBottleneck")
    assert f["evidence"]["getnext_share"] == share
    assert f"{percent(share)} of train step time waits" in f["message"]
    assert f"GetNext {percent(share)} of train step time" in " ".join(format_text(s).split())
    assert f["evidence"]["step_ms_mean"] == s["steps"]["train"]["mean_ms"]
    assert f["evidence"]["steps"] == s["steps"]["train"]["count"] == 10
    # the worker start-up of the first step is what made the two numbers differ
    train = run.steps[run.steps["mode"] == "train"].sort_values("start_ns").iloc[1:]
    assert train["GetNext"].sum() / train["duration_ns"].sum() < share - 0.05
    # the rest of the step, in no phase (the 5 ms of host work), over the same steps
    other, every = s["other"], run.steps[run.steps["mode"] == "train"]
    assert other["total_ms"] == round(every["Other"].sum() / 1e6, 3) and other["total_ms"] >= 5 * 9
    assert other["share"] == pytest.approx(1 - sum(p["share"] for p in s["phases"].values()), abs=0.001)
    assert f"Other {percent(other['share'])} of train step time, in no phase" in " ".join(format_text(s).split())


@pytest.mark.slow
def test_epoch_start_figure_for_persistent_workers(tmp_path):
    """A DataLoader with num_workers=2 starts its workers again at every epoch: the first
    step of each epoch waits longer, and the finding says what persistent_workers=True saves.
    With persistent_workers=True already set, it says nothing of the kind."""
    pytest = __import__("pytest")
    pytest.importorskip("torch")
    import numpy as np

    from stepscope.analysis.report.summary import summarize
    from stepscope.core.vocabulary import END_MARK

    run = _epochs_run(tmp_path, "plain", "4", "plain", "2")
    f = _finding(summarize(run), "GetNextBottleneck")
    epoch = f["evidence"]["epoch_start"]
    # the figure, measured again here from the tables: first steps are those after a loader ran out
    ev, steps = run.events, run.steps.sort_values("start_ns")
    ends = np.sort(ev[(ev["category"] == "step") & (ev["name"] == END_MARK)]["start_ns"].to_numpy())
    seen = np.searchsorted(ends, steps["start_ns"].to_numpy(), side="right")
    first = np.r_[True, seen[1:] > seen[:-1]]
    assert first.sum() == 4 and list(steps["step"][first]) == [0, 10, 20, 30]
    getnext = steps["GetNext"].to_numpy()
    later = np.flatnonzero(first)[1:]
    last = later - 1  # the steps that shut the workers down
    rest = np.ones(len(steps), dtype=bool)
    rest[first] = rest[last] = False
    start_med, end_med, other_med = (np.median(getnext[i]) for i in (later, last, rest))
    assert epoch["epochs"] == 4
    assert epoch["first_step_getnext_ms"] == round(start_med / 1e6, 3)
    assert epoch["other_getnext_ms"] == round(other_med / 1e6, 3)
    excess = (start_med - other_med + max(0.0, end_med - other_med)) / 1e6
    assert epoch["excess_ms"] == round(excess, 3) and excess > 10
    assert f"persistent_workers=True would remove about {excess:.0f} ms per epoch" in f["recommendation"]
    assert f["recommendation"].index("would remove") < f["recommendation"].index("num_workers")

    kept = _epochs_run(tmp_path, "persistent", "4", "persistent", "2")
    f = _finding(summarize(kept), "GetNextBottleneck")
    assert "epoch_start" not in f["evidence"] and "would remove" not in f["recommendation"]
    # what told it: each pass over the loader recorded that it keeps its workers (the plain one did not)
    from stepscope.core.vocabulary import LOADER_PERSISTENT

    for r, value in ((kept, 1), (run, 0)):
        marks = r.events[r.events["name"] == LOADER_PERSISTENT]
        assert len(marks) == 4 and (marks["arg"] == value).all()


def test_other_counts_each_steps_gaps_when_processes_overlap_in_time():
    """Two processes' steps at the same times (ranks): a step's covered time is the union of
    its own phases, never stretched by another process's later phases (the gap between
    Backward and Optimizer stays Other)."""
    import numpy as np

    from stepscope.analysis.tables.stepping import _covered_per_step

    # rows 0-1: rank 0's steps [0, 100) and [100, 200); row 2: rank 1's step [0, 100) with
    # phases [0, 10) and [20, 30), which come after rank 0's rows
    row = np.array([0, 1, 2, 2])
    starts, ends = np.array([0, 100, 0, 20]), np.array([90, 190, 10, 30])
    assert _covered_per_step(row, starts, ends, np.array([100, 200, 100])).tolist() == [90, 90, 20]
