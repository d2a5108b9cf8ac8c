"""SageMaker Debugger's rule configurations, the Debugger-style reporting rules, CI gates
and custom rules, against real profiled torch jobs (tests/scripts/rule_jobs.py)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from stepscope.analysis.rules import ParamError, debugger, parse_params

JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "rule_jobs.py")
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_INTERVAL_MS="20", **extra)
    return env


def stepscope(tmp_path, *args, env=None):
    return subprocess.run([sys.executable, "-m", "stepscope", *args], cwd=tmp_path, env=env or _env(tmp_path),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def stall(tmp_path_factory):
    """A real torch job with four slow steps (StepOutlier fires, nothing else)."""
    tmp = tmp_path_factory.mktemp("stall")
    r = stepscope(tmp, "run", "--name", "stall", "--", sys.executable, JOBS, "stall")
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp, str(tmp / "runs" / "stall")


def summary(tmp, run, *args, env=None):
    r = stepscope(tmp, "summary", run, "--json", *args, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# --- Debugger's names -------------------------------------------------------------------
def test_every_debugger_parameter_is_accepted_or_refused_in_one_line():
    for rule, rows in debugger.TRANSLATIONS.items():
        for name, _, _ in rows:
            assert parse_params([f"{rule}.{name}=5"]) == {rule: {name: 5.0}}
            # Debugger's ProfilerReport keys, rule names in any case
            assert parse_params([f"ProfilerReport.{rule.lower()}_{name}=5"]) == {rule: {name: 5.0}}
    for (rule, name), _ in debugger.REFUSED.items():
        with pytest.raises(ParamError, match="window_share") as e:
            parse_params([f"{rule}.{name}=10"])
        assert "\n" not in str(e.value)
    with pytest.raises(ParamError, match="model rule"):
        parse_params(["LossNotDecreasing.patience=3"])
    assert parse_params(["StepOutlier.mode=training"]) == {"StepOutlier": {"mode": "train"}}
    assert parse_params(["StepOutlier.mode=ModeKeys.EVAL"]) == {"StepOutlier": {"mode": "eval"}}
    assert parse_params(["steposutlier.mode=none".replace("os", "o")]) == {"StepOutlier": {"mode": "all"}}
    assert parse_params(["CPUBottleneck.severity=ERROR"]) == {"CPUBottleneck": {"severity": "error"}}


def test_debugger_parameters_translate_with_the_runs_interval(stall):
    tmp, run = stall
    s = summary(tmp, run, "--param", "StepOutlier.stddev=4", "--param", "StepOutlier.n_outliers=10",
                "--param", "LowGPUUtilization.window=500", "--param", "MaxInitializationTime.threshold=2",
                "--param", "ProfilerReport.CPUBottleneck_threshold=60", "--param", "BatchSize.patience=100",
                "--param", "StepOutlier.scan_interval_us=60000000")
    used = s["rules_params"]
    assert used["StepOutlier"]["mad_multiple"] == 4 and used["StepOutlier"]["min_outliers"] == 11
    assert used["LowGPUUtilization"]["window_s"] == pytest.approx(10.0)  # 500 samples x 20 ms
    assert used["MaxInitializationTime"]["threshold_s"] == 120
    assert used["CPUBottleneck"]["min_share"] == pytest.approx(0.6)
    median_s = s["steps"]["train"]["median_ms"] / 1e3
    assert used["BatchSize"]["warmup_steps"] == pytest.approx(-(-2.0 // median_s), abs=1)  # 2 s of steps
    assert len(s["param_translations"]) == 7
    # n_outliers=10: Debugger ignored the first ten outliers; this job has four
    assert s["findings"] == []


def test_step_outlier_mode_and_reporting_rules(stall):
    tmp, run = stall
    s = summary(tmp, run, "--param", "StepOutlier.mode=eval")
    assert s["findings"] == []  # the slow steps are train steps
    s = summary(tmp, run, "--param", "StepOutlier.mode=training")
    assert [f["rule"] for f in s["findings"]] == ["StepOutlier"]
    d = s["rule_details"]
    cpu = d["OverallSystemUsage"]["nodes"]
    (node,) = cpu
    u = cpu[node]["cpu_util"]
    assert u["unit"] == "%" and u["min"] <= u["p50"] <= u["p95"] <= u["p99"] <= u["max"] <= 100
    train = d["OverallFrameworkMetrics"]["modes"]["train"]
    assert train["steps"] == 60
    assert train["phases"]["Forward"]["share"] == s["phases"]["Forward"]["share"]  # the summary's figure
    (loader,) = d["Dataloader"]["processes"]
    assert loader["workers"] == 0 and loader["cores"] >= 1
    report = d["ProfilerReport"]
    assert report["triggered"] == ["StepOutlier"] and "GetNextBottleneck" in report["passed"]
    assert {r["rule"] for r in report["rules"]} >= {"Dataloader", "OverallSystemUsage", "LowGPUUtilization"}


# --- CI gates -----------------------------------------------------------------------------
def test_fail_on_gates_summary_by_severity(stall):
    tmp, run = stall
    assert stepscope(tmp, "summary", run, "--fail-on", "WARN").returncode == 1
    assert stepscope(tmp, "summary", run, "--fail-on", "ERROR").returncode == 0
    r = stepscope(tmp, "summary", run, "--fail-on", "ERROR", "--param", "StepOutlier.severity=error")
    assert r.returncode == 1 and "StepOutlier" in r.stderr and "findings:" in r.stdout
    assert stepscope(tmp, "summary", run, "--fail-on", "WARN", "--param", "StepOutlier.severity=info").returncode == 0
    assert stepscope(tmp, "summary", run, "--fail-on", "SOMETIMES").returncode == 2


@pytest.mark.slow
def test_fail_on_gates_diff_on_a_step_time_regression(tmp_path):
    env = _env(tmp_path)
    for kind in ("clean", "slowdata"):
        r = stepscope(tmp_path, "run", "--name", kind, "--", sys.executable, JOBS, kind, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
    r = stepscope(tmp_path, "diff", "clean", "slowdata", "--fail-on", "ERROR", "--json", env=env)
    assert r.returncode == 1, r.stdout
    d = json.loads(r.stdout)
    assert [x["metric"] for x in d["regressions"]] == ["train step time (median)"]
    assert "train step time (median)" in r.stderr
    # the other way round the step time fell: nothing to gate on
    assert stepscope(tmp_path, "diff", "slowdata", "clean", "--fail-on", "WARN", env=env).returncode == 0
    big = stepscope(tmp_path, "diff", "clean", "slowdata", "--fail-on", "ERROR", "--max-regression", "100000",
                    env=env)
    assert big.returncode == 0, big.stderr
    # WARN also gates on the findings new in the second run
    new = stepscope(tmp_path, "diff", "clean", "slowdata", "--fail-on", "WARN", "--max-regression", "100000",
                    env=env)
    assert new.returncode == 1 and "GetNextBottleneck" in new.stderr


# --- custom rules -------------------------------------------------------------------------
def test_custom_rule_from_rules_option(stall):
    tmp, run = stall
    env = _env(tmp, PYTHONPATH=EXAMPLES)
    s = summary(tmp, run, "--rules", "custom_rule:StepTimeBudget", "--param", "StepTimeBudget.max_median_ms=0.5",
                env=env)
    (f,) = [f for f in s["findings"] if f["rule"] == "StepTimeBudget"]
    assert f["severity"] == "error" and f["evidence"]["median_ms"] == s["steps"]["train"]["median_ms"]
    s = summary(tmp, run, "--rules", "custom_rule:StepTimeBudget", env=env)
    assert "StepTimeBudget" not in {f["rule"] for f in s["findings"]}  # 100 ms default budget
    r = stepscope(tmp, "summary", run, "--rules", "custom_rule:StepTimeBudget", "--fail-on", "ERROR",
                  "--param", "StepTimeBudget.max_median_ms=0.5", env=env)
    assert r.returncode == 1
    bad = stepscope(tmp, "summary", run, "--rules", "no_such_module:X", env=env)
    assert bad.returncode == 2 and "cannot import" in bad.stderr


def test_custom_rule_from_an_entry_point(stall, tmp_path):
    """An installed plugin: a dist-info with an entry point in the stepscope.rules group."""
    tmp, run = stall
    site = tmp_path / "site"
    info = site / "budget_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: budget-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[stepscope.rules]\nbudget = custom_rule:StepTimeBudget\n")
    env = _env(tmp, PYTHONPATH=os.pathsep.join([str(site), EXAMPLES]))
    s = summary(tmp, run, "--param", "StepTimeBudget.max_median_ms=0.5", env=env)
    assert "StepTimeBudget" in {f["rule"] for f in s["findings"]}
    assert "StepTimeBudget" in s["rule_details"]["ProfilerReport"]["triggered"]
