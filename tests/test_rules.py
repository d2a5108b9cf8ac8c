"""Each rule against a real job that provokes it, and a clean job that provokes none."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import finding_where_judged
from synthetic import steps_run

pytest.importorskip("torch")

from stepscope.analysis.rules import RULES, ParamError, Rule, parse_params
from stepscope.analysis.rules.base import Finding

JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "rule_jobs.py")


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_INTERVAL_MS="20")
    return env


def run_job(tmp_path, kind, *params, torchrun=False):
    env = _env(tmp_path)
    cmd = [sys.executable, JOBS, kind]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
               JOBS, kind]
    r = subprocess.run([sys.executable, "-m", "stepscope", "run", "--name", kind, "--", *cmd], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    args = [a for p in params for a in ("--param", p)]
    s = subprocess.run([sys.executable, "-m", "stepscope", "summary", kind, "--json", *args], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert s.returncode == 0, s.stderr
    return json.loads(s.stdout)


def fired(summary):
    return sorted({f["rule"] for f in summary["findings"]})


@pytest.mark.slow
def test_clean_job_triggers_nothing(tmp_path):
    s = run_job(tmp_path, "clean")
    assert fired(s) == [], s["findings"]
    assert s["steps"]["train"]["count"] == 60
    assert "LoadBalancing" in s["rules_not_applicable"]


@pytest.mark.slow
def test_slow_dataset_is_input_bound(tmp_path):
    s = run_job(tmp_path, "slowdata")
    # one problem, one finding: the wait, costed per step
    assert fired(s) == ["GetNextBottleneck"], s["findings"]
    (f,) = s["findings"]
    assert f["evidence"]["getnext_share"] > 0.2  # (over the rule's threshold: the wait, not the end of data)
    assert "num_workers" in f["recommendation"]
    g = s["phases"]["GetNext"]
    assert f["cost_ms_per_step"] == f["evidence"]["getnext_ms_mean"] == pytest.approx(g["total_ms"] / g["count"],
                                                                                       abs=0.001)
    # Dataloader (Debugger's rule: no workers on this machine's cores) names the cause of the same wait
    (d,) = s["related_findings"]
    assert d["rule"] == "Dataloader" and d["related_to"]["rule"] == "GetNextBottleneck"
    assert d["evidence"]["workers"] == 0 and d["evidence"]["cores"] >= 1
    assert d["evidence"]["getnext_share"] == f["evidence"]["getnext_share"]  # one number per quantity
    assert [e["rule"] for e in f["explains"]] == ["Dataloader"]


@pytest.mark.slow
def test_periodic_stall_names_the_steps_and_other(tmp_path):
    s = run_job(tmp_path, "stall")
    assert fired(s) == ["StepOutlier"], s["findings"]
    (f,) = s["findings"]
    outliers = {o["step"]: o for o in f["evidence"]["outliers"]}
    assert {7, 22, 37, 52} <= set(outliers)  # the sleep after step i's optimizer is Other in step i
    # a loaded machine may add a hiccup of its own: far smaller than the 0.2 s stalls
    stalls = min(outliers[n]["excess_ms"] for n in (7, 22, 37, 52))
    assert all(o["excess_ms"] < 0.5 * stalls for n, o in outliers.items() if n not in (7, 22, 37, 52)), outliers
    assert f["evidence"]["mostly"] == "Other" and f["evidence"]["pattern"] == "recurring every 15 steps"


@pytest.mark.slow
def test_epoch_start_outliers_name_persistent_workers(tmp_path):
    """Each epoch's first step waits for the DataLoader to start its workers again (each
    opens its data: 0.1 s). The loop is not input-bound (GetNext ~10%), so StepOutlier is
    the finding: it names those steps as epoch starts and what persistent_workers=True saves."""
    s = run_job(tmp_path, "epochworkers")
    assert fired(s) == ["StepOutlier"], s["findings"]
    (f,) = s["findings"]
    # the epochs' first steps; under load also their last ones, whose fetch shuts the workers down
    firsts = sorted(o["step"] for o in f["evidence"]["outliers"] if o.get("epoch") == "first")
    assert firsts == [40, 80], f["evidence"]["outliers"]
    assert {o["step"] for o in f["evidence"]["outliers"] if o.get("epoch") != "first"} <= {39, 79, 119}
    assert all(o.get("epoch") for o in f["evidence"]["outliers"])
    epoch = f["evidence"]["epoch_start"]
    assert epoch["epochs"] == 3 and epoch["first_step_getnext_ms"] >= 100, epoch
    assert "persistent_workers=True would remove about" in f["recommendation"]
    assert "steps of epochs" in f["message"]


@pytest.mark.slow
def test_an_input_bound_loop_explains_its_epoch_start_outliers(tmp_path):
    """The same loader under a small model: input-bound, one finding (GetNextBottleneck with
    the persistent_workers figure), and the epoch-start outliers are related to it."""
    s = run_job(tmp_path, "epochworkers_small")
    assert fired(s) == ["GetNextBottleneck"], s["findings"]
    (f,) = s["findings"]
    assert f["evidence"]["epoch_start"]["epochs"] == 3
    related = {r["rule"]: r for r in s["related_findings"]}
    assert related["StepOutlier"]["related_to"]["rule"] == "GetNextBottleneck", related
    assert "steps of epochs" in related["StepOutlier"]["related_to"]["why"]


@pytest.mark.slow
def test_growing_list_of_tensors_is_a_memory_increase(tmp_path):
    s = run_job(tmp_path, "leak")
    assert fired(s) == ["HostMemoryIncrease"], s["findings"]
    assert s["findings"][0]["evidence"]["growth_mb"] > 400


@pytest.mark.slow
def test_sleep_before_training_is_slow_initialization(tmp_path):
    s = run_job(tmp_path, "slowinit", "MaxInitializationTime.threshold_s=5")
    assert fired(s) == ["MaxInitializationTime"], s["findings"]
    assert s["findings"][0]["evidence"]["initialization_s"] >= 6


@pytest.mark.alone  # a straggler is judged only where the job has the host to itself (LoadBalancing)
def test_ddp_straggler_is_named(tmp_path, monkeypatch):
    s = run_job(tmp_path, "straggler", torchrun=True)
    f = finding_where_judged(s, "LoadBalancing")
    assert fired(s) == ["LoadBalancing"], s["findings"]  # CommunicationBound: related to it
    assert f["rank"] == 1 and f["evidence"]["slow_rank"] == 1
    # rank 1 sleeps 15 ms a step: rank 0 waits that long for it in the all-reduce (issue 46)
    # (20 ms a step injected; the test runs alone: LoadBalancing judges only a host the job has to itself)
    assert 12 <= f["evidence"]["waited_ms_per_step"] <= 30  # time-bound: runs alone
    assert [r["rule"] for r in s["related_findings"]] == ["CommunicationBound"]
    # issue 13: this 2-rank run read as a large one (its Parquet dataset, no events table)
    # gives every rule's findings and the whole summary exactly as decoded in memory
    import stepscope
    from stepscope.analysis.store import dataset_read
    from stepscope.analysis.run import Run
    from stepscope.analysis.report.summary import summarize

    path = tmp_path / "runs" / "straggler"
    memory = summarize(stepscope.load(path, cache=False, quiet=True))
    monkeypatch.setattr(dataset_read, "LARGE_EVENTS", 0)
    large = Run(path, dataset=True)
    assert large.large and memory["ranks"] == 2
    assert json.dumps(summarize(large), sort_keys=True, default=str) == json.dumps(memory, sort_keys=True,
                                                                                   default=str)
    assert not large._store.has("events")


def test_param_parsing_errors_are_clear():
    assert parse_params(["GetNextBottleneck.threshold=0.3"]) == {"GetNextBottleneck": {"threshold": 0.3}}
    for bad, msg in [("Nope.x=1", "unknown rule"), ("GetNextBottleneck.nope=1", "has no parameter"),
                     ("GetNextBottleneck.threshold=high", "not a number"), ("threshold=1", "Rule.param=value")]:
        with pytest.raises(ParamError, match=msg):
            parse_params([bad])
    assert all(r.summary for r in RULES)


# --- negligible findings (issue 47, item 9; SPEC §7) --------------------------------------

MARKED_LOOP = """
import sys, time, stepscope
steps, step_s, stall_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
run = stepscope.start(dir="runs", name=sys.argv[4], pysample_hz=0)
for i in range(steps):
    stepscope.step()
    end = time.perf_counter() + step_s
    while time.perf_counter() < end:  # the step's work
        pass
    if i == steps // 2:
        time.sleep(stall_s)  # one hiccup
stepscope.end_step()
run.stop()
"""


def _marked_run(tmp_path, name, steps, step_s, stall_s):
    import stepscope

    (tmp_path / "loop.py").write_text(MARKED_LOOP)
    r = subprocess.run([sys.executable, "loop.py", str(steps), str(step_s), str(stall_s), name], cwd=tmp_path,
                       env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return stepscope.load(tmp_path / "runs" / name, quiet=True)


def test_a_hiccup_worth_microseconds_a_step_is_not_a_finding(tmp_path, monkeypatch):
    """One 60 ms stall among 100,000 steps of ~10 us: StepOutlier's outlier, but it costs
    about 0.0006 ms a step (with a loaded machine's own hiccups, a few times that), below
    the absolute floor. Listed as below the floor, not found. (One slow step is no
    finding of StepOutlier's anyway, issue 64: here it is told to report any outlier, so
    that the floor is what stops it.)"""
    from stepscope.analysis.rules import base, evaluate

    run = _marked_run(tmp_path, "hiccup", 100_000, 0.000005, 0.06)
    assert (run.steps["mode"] == "train").sum() == 100_000
    floor_ms = base.MIN_COST_MS
    monkeypatch.setattr(base, "MIN_COST_MS", 0.0)
    monkeypatch.setattr(base, "MIN_COST_SHARE", 0.0)
    monkeypatch.setattr(base, "MIN_TOTAL_S", 0.0)
    any_outlier = {"StepOutlier": {"min_recurring": 1, "min_step_share": 0, "min_cost_share": 0}}
    (outlier,) = [f for f in evaluate(run, any_outlier)["findings"] if f["rule"] == "StepOutlier"]  # it fires
    assert 0 < outlier["cost_ms_per_step"] < floor_ms
    monkeypatch.undo()
    result = evaluate(run, any_outlier)
    assert "StepOutlier" not in {f["rule"] for f in result["findings"] + result["related_findings"]}
    (below,) = [b for b in result["below_cost_floor"] if b["rule"] == "StepOutlier"]
    assert below["floor_ms"] == base.MIN_COST_MS  # 1% of a 10 us step is less
    assert below["cost_ms_per_step"] == pytest.approx(outlier["cost_ms_per_step"], abs=1e-3)


class _FixedCost(Rule):  # a custom rule whose finding costs what the test chooses
    name, summary, cost = "FixedCost", "a finding of a given cost per step", None

    def evaluate(self, run, p):
        return [Finding(rule=self.name, severity="warning", message="m", recommendation="r",
                        evidence={"process": str(run.steps["process"].iloc[0])}, cost_ms_per_step=self.cost)]


def _judged_with_fixed_cost(run, cost):
    """Every rule's result on ``run``, with a custom rule whose one finding costs ``cost``."""
    from stepscope.analysis.rules import evaluate, registry

    rule = _FixedCost()
    rule.cost = cost
    registry.register(rule)
    try:
        return evaluate(run)
    finally:
        registry._custom[:] = [c for c in registry._custom if c.name != rule.name]


@pytest.mark.parametrize("cost, found", [(0.05, False), (0.19, False), (0.5, True), (None, True)])
def test_every_rule_passes_the_floor_relative_to_its_step(tmp_path, monkeypatch, cost, found):
    """Steps of 20 ms: the floor is 1% of the median step (0.2 ms), above the absolute one.
    Any rule's finding, a custom one's too, below it is dropped; one whose cost is not a time
    per step (None) is kept. (The floor on the run's total: the next test.)"""
    from stepscope.analysis.rules import base
    from stepscope.analysis.rules.base import cost_floor_ms

    monkeypatch.setattr(base, "MIN_TOTAL_S", 0.0)
    run = _marked_run(tmp_path, "long", 30, 0.02, 0.0)
    result = _judged_with_fixed_cost(run, cost)
    median_ms = float(run.steps["duration_ns"].median()) / 1e6
    assert median_ms > 19.5  # 20 ms of work (and a loaded machine's delays)
    assert ("FixedCost" in {f["rule"] for f in result["findings"]}) is found
    if not found:
        (below,) = result["below_cost_floor"]
        assert below["floor_ms"] == pytest.approx(0.01 * median_ms, abs=1e-3)
        assert below["floor_ms"] == pytest.approx(cost_floor_ms(run, _FixedCost().evaluate(run, {})[0]), abs=1e-3)


@pytest.mark.parametrize("cost, found", [(2.0, False), (5.0, True)])
def test_a_finding_worth_under_a_tenth_of_a_second_over_the_run_is_dropped(tmp_path, cost, found):
    """30 steps of 20 ms: a cost of 2 ms a step (10% of a step, over the relative floor) is
    0.06 s over the run, under the 0.1 s floor: a tiny job's fixed cost, dropped and listed
    with its total; 5 ms a step (0.15 s) is a finding."""
    from stepscope.analysis.rules.base import MIN_TOTAL_S

    run = _marked_run(tmp_path, "short", 30, 0.02, 0.0)
    result = _judged_with_fixed_cost(run, cost)
    assert ("FixedCost" in {f["rule"] for f in result["findings"]}) is found
    if not found:
        (below,) = result["below_cost_floor"]
        assert below["total_s"] == pytest.approx(cost * 30 / 1e3, abs=1e-3) and below["floor_total_s"] == MIN_TOTAL_S


# --- StepOutlier: only where it pays (issue 64) ------------------------------------------------

def _outliers(summary):
    return [f for f in summary["findings"] + summary["related_findings"] if f["rule"] == "StepOutlier"]


def _synthetic_summary(tmp_path, name, steps_ms, extra_ms):
    """The summary (every rule) of a run written to order (tests/synthetic.py): StepOutlier's
    judgement is about time, so its tests choose every step's length, and hold on a busy machine."""
    import stepscope
    from stepscope.analysis.report.summary import summarize

    return summarize(stepscope.load(str(steps_run(tmp_path, name, steps_ms, extra_ms)), quiet=True))


def _jittered(n, ms, seed=0):
    """n step lengths around ``ms``: a healthy loop's 3% spread."""
    return list(np.random.default_rng(seed).normal(ms, 0.03 * ms, n).clip(0.8 * ms, 1.3 * ms))


def test_one_slow_step_in_a_hundred_is_listed_not_reported(tmp_path):
    """A single 0.3 s step among 120: an outlier, but nothing to act on. No finding; the
    summary's rule_details list it with the reason."""
    extra = [300.0 if i == 60 else 0.0 for i in range(120)]
    s = _synthetic_summary(tmp_path, "onehiccup", [w + e for w, e in zip(_jittered(120, 10), extra)], extra)
    assert s["steps"]["train"]["count"] == 120
    assert not _outliers(s), s["findings"]
    (quiet,) = [q for q in s["rule_details"]["StepOutlier"]["outliers_not_reported"] if q["mode"] == "train"]
    assert quiet["steps"] == [60] and "an isolated step" in quiet["why_not_reported"], quiet


def test_a_periodic_40_ms_stall_is_found_with_its_period(tmp_path):
    extra = [40.0 if i % 40 == 25 else 0.0 for i in range(240)]
    s = _synthetic_summary(tmp_path, "stall40", [w + e for w, e in zip(_jittered(240, 8), extra)], extra)
    (f,) = _outliers(s)
    assert sorted(o["step"] for o in f["evidence"]["outliers"]) == [25, 65, 105, 145, 185, 225]
    assert f["evidence"]["pattern"] == "recurring every 40 steps", f["evidence"]
    assert f["evidence"]["mostly"] == "Other"
    # what fixing it saves: the stalls' excess over a median step, spread over the steps
    excess = sum(o["excess_ms"] for o in f["evidence"]["outliers"])
    assert f["cost_ms_per_step"] == pytest.approx(excess / 240, rel=0.15), f


def test_a_tenth_of_the_steps_three_times_slower_is_found(tmp_path):
    import random

    slow = set(random.Random(0).sample(range(5, 200), 20))
    work = _jittered(200, 30)
    extra = [2 * w if i in slow else 0.0 for i, w in enumerate(work)]
    s = _synthetic_summary(tmp_path, "slowtenth", [w + e for w, e in zip(work, extra)], extra)
    (f,) = _outliers(s)
    assert sorted(o["step"] for o in f["evidence"]["outliers"]) == sorted(slow), f["evidence"]
    assert f["evidence"]["pattern"].endswith("% of the steps") and f["evidence"]["cost_share"] > 0.1, f["evidence"]


def test_a_healthy_loop_written_three_times_gets_no_finding(tmp_path):
    """The same healthy loop (3% spread) three times: the same verdict, none."""
    for seed in range(3):
        s = _synthetic_summary(tmp_path, f"healthy{seed}", _jittered(200, 10, seed), [0.0] * 200)
        assert s["findings"] == [] and not _outliers(s), s["findings"]


@pytest.mark.slow
def test_the_first_validation_pass_warming_up_is_no_finding(tmp_path):
    """4 epochs with a validation pass each; the first pass is slow (caches, traces) and the
    later ones are not: warm-up, listed with its reason, no finding."""
    s = run_job(tmp_path, "evalpasses")
    assert s["steps"]["eval"]["count"] == 48
    assert not _outliers(s), s["findings"]
    (quiet,) = [q for q in s["rule_details"]["StepOutlier"]["outliers_not_reported"] if q["mode"] == "eval"]
    assert set(quiet["steps"]) <= set(range(12)) and "first of 4 passes" in quiet["why_not_reported"], quiet


@pytest.mark.alone  # it makes the machine busy on purpose
def test_a_short_job_on_a_busy_machine_gets_no_step_outlier(tmp_path):
    """The clean job while two other processes keep every core busy: its steps are slowed at
    random by the scheduler, which is no pattern to act on."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        s = run_job(tmp_path, "clean")
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert s["steps"]["train"]["count"] == 60
    assert not _outliers(s), s["findings"]


def test_the_period_of_outliers_survives_a_hiccup_between():
    import numpy as np

    from stepscope.analysis.rules.outlier import _period

    assert _period(np.array([7, 22, 37, 52])) == 15
    assert _period(np.array([7, 22, 37, 52, 55])) == 15  # a loaded machine's hiccup among the stalls
    assert _period(np.array([7, 8, 22, 37, 52])) == 15  # one beside a stall: the median gap is 14.5 (CI)
    assert _period(np.array([52, 56, 60])) == 0  # three steps: two gaps, equal by chance
    rng = np.random.default_rng(0)
    assert _period(np.sort(rng.choice(np.arange(5, 200), 20, replace=False))) == 0  # no period
