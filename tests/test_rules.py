"""Each rule against a real job that provokes it, and a clean job that provokes none."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from stepscope.analysis.rules import RULES, ParamError, parse_params  # noqa: E402

JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "rule_jobs.py")


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_INTERVAL_MS="20")
    return env


def run_job(tmp_path, kind, *params, torchrun=False):
    env = _env(tmp_path)
    cmd = [sys.executable, JOBS, kind]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29741",
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


def test_clean_job_triggers_nothing(tmp_path):
    s = run_job(tmp_path, "clean")
    assert fired(s) == [], s["findings"]
    assert s["steps"]["train"]["count"] == 60
    assert "LoadBalancing" in s["rules_not_applicable"]


def test_slow_dataset_is_input_bound(tmp_path):
    s = run_job(tmp_path, "slowdata")
    # one problem, one finding: the wait, costed per step
    assert fired(s) == ["GetNextBottleneck"], s["findings"]
    (f,) = s["findings"]
    assert f["evidence"]["getnext_share"] > 0.3
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


def test_periodic_stall_names_the_steps_and_other(tmp_path):
    s = run_job(tmp_path, "stall")
    assert fired(s) == ["StepOutlier"], s["findings"]
    (f,) = s["findings"]
    steps = sorted(o["step"] for o in f["evidence"]["outliers"])
    assert steps == [7, 22, 37, 52]  # the sleep after step i's optimizer is Other in step i
    assert f["evidence"]["mostly"] == "Other"


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


def test_growing_list_of_tensors_is_a_memory_increase(tmp_path):
    s = run_job(tmp_path, "leak")
    assert fired(s) == ["HostMemoryIncrease"], s["findings"]
    assert s["findings"][0]["evidence"]["growth_mb"] > 400


def test_sleep_before_training_is_slow_initialization(tmp_path):
    s = run_job(tmp_path, "slowinit", "MaxInitializationTime.threshold_s=5")
    assert fired(s) == ["MaxInitializationTime"], s["findings"]
    assert s["findings"][0]["evidence"]["initialization_s"] >= 6


def test_ddp_straggler_is_named(tmp_path, monkeypatch):
    s = run_job(tmp_path, "straggler", torchrun=True)
    assert fired(s) == ["LoadBalancing"], s["findings"]
    (f,) = s["findings"]
    assert f["rank"] == 1 and f["evidence"]["slow_rank"] == 1
    assert 10 <= f["evidence"]["extra_ms_per_step"] <= 30
    # issue 13: this 2-rank run read as a large one (its Parquet dataset, no events table)
    # gives every rule's findings and the whole summary exactly as decoded in memory
    import stepscope
    from stepscope.analysis import dataset
    from stepscope.analysis.run import Run
    from stepscope.analysis.summary import summarize

    path = tmp_path / "runs" / "straggler"
    memory = summarize(stepscope.load(path, cache=False, quiet=True))
    monkeypatch.setattr(dataset, "LARGE_EVENTS", 0)
    large = Run(path, dataset=True)
    assert large.large and memory["ranks"] == 2
    assert json.dumps(summarize(large), sort_keys=True, default=str) == json.dumps(memory, sort_keys=True,
                                                                                   default=str)
    assert "events" not in large._tables


def test_param_parsing_errors_are_clear():
    assert parse_params(["GetNextBottleneck.threshold=0.3"]) == {"GetNextBottleneck": {"threshold": 0.3}}
    for bad, msg in [("Nope.x=1", "unknown rule"), ("GetNextBottleneck.nope=1", "has no parameter"),
                     ("GetNextBottleneck.threshold=high", "not a number"), ("threshold=1", "Rule.param=value")]:
        with pytest.raises(ParamError, match=msg):
            parse_params([bad])
    assert all(r.summary for r in RULES)
