"""The memory rules judge the steady state: growth while warming up is not a leak (issue 20).

Host memory: real training jobs (tests/scripts/memory_jobs.py) under `stepscope run`.
GPU memory: runs written through the core with simulated NVML samples (as in
tests/test_gpu_rules.py).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import stepscope

pytest.importorskip("torch")

JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "memory_jobs.py")
MB = 1 << 20


def run_job(tmp_path, kind):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_INTERVAL_MS="20")
    r = subprocess.run([sys.executable, "-m", "stepscope", "run", "--name", kind, "--", sys.executable, JOBS, kind],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = subprocess.run([sys.executable, "-m", "stepscope", "summary", kind, "--json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert s.returncode == 0, s.stderr
    return json.loads(s.stdout), stepscope.load(str(tmp_path / "runs" / kind), quiet=True)


def loop_rss_mb(run):
    """(RSS at the first and at the last sample of the training loop), MB."""
    steps = run.steps
    rss = run.system[run.system["metric"] == "proc_rss"].sort_values("timestamp_ns")
    rss = rss[(rss["timestamp_ns"] >= steps["start_ns"].min()) & (rss["timestamp_ns"] <= steps["end_ns"].max())]
    return rss["value"].iloc[0] / MB, rss["value"].iloc[-1] / MB


def memory_findings(summary):
    return [f for f in summary["findings"] if f["rule"] == "HostMemoryIncrease"]


@pytest.mark.slow
def test_memory_that_grows_while_warming_up_then_stays_flat_is_no_leak(tmp_path):
    s, run = run_job(tmp_path, "warmup")
    assert s["steps"]["train"]["count"] == 150
    start, end = loop_rss_mb(run)
    assert end - start > 700  # 30 x 32 MiB kept: the old rule said "grew from ~700 MB to ~1300 MB"
    assert memory_findings(s) == [], s["findings"]
    assert "HostMemoryIncrease" not in s["rules_not_applicable"]


@pytest.mark.slow
def test_a_leak_that_starts_after_the_warm_up_is_found_with_its_rate(tmp_path):
    s, run = run_job(tmp_path, "late")
    (f,) = memory_findings(s)
    ev = f["evidence"]
    # the steady state: from the documented 2 warm-up steps (a few more only if this shared
    # machine slowed three first steps in a row) to the last
    assert ev["steps"][1] == 149 and 2 <= ev["steps"][0] == ev["warmup_steps_left_out"] <= 5
    assert 7.0 <= ev["growth_mb_per_step"] <= 9.0  # 8 MiB a step from step 40 on
    assert ev["growth_mb"] > 500 and ev["trend_late"] > 0.9 and ev["late_growth_ratio"] >= 1.0
    # the time until the host's memory is used up follows from its free memory and the steady rate
    assert ev["time_to_full_s"] == pytest.approx(ev["host_free_mb"] / ev["rate_mb_per_min"] * 60, rel=0.01, abs=0.1)
    assert f"{ev['rate_mb_per_min']:.0f} MB/min" in f["message"] and "is used up in" in f["message"]


@pytest.mark.slow
def test_growth_over_a_steady_state_too_short_to_judge_is_not_extrapolated(tmp_path):
    """Issue 47: "still grows 115531 MB/min ... used up in 12 s" from a 1.7 s window. Here a
    loop of about a second keeps 8 MiB every step: no rate in time is extrapolated from it and
    no time until memory runs out. Issue 58: memory that grows by the same amount at every
    step through the loop is a leak whatever the duration: found by its steps. Judged from
    any window (the rule before), the same run was a leak to be used up within minutes."""
    from stepscope.analysis.rules import evaluate

    s, run = run_job(tmp_path, "shortwindow")
    assert s["steps"]["train"]["count"] == 60
    start, end = loop_rss_mb(run)
    assert end - start > 400  # it did grow: 60 x 8 MiB
    (f,) = memory_findings(s)
    assert "used up" not in f["message"] and "MB/min" not in f["message"] and "every step" in f["message"]
    loop_s = (run.steps["end_ns"].max() - run.steps["start_ns"].min()) / 1e9  # the window is the loop's
    assert f["evidence"]["time_to_full_s"] is None and f["evidence"]["window_s"] <= loop_s + 0.5
    assert 6 <= f["evidence"]["growth_mb_per_step"] <= 10, f["evidence"]  # 8 MiB a step
    anywindow = {"HostMemoryIncrease": {"min_window_s": 0, "min_window_share": 0}}
    (old,) = [f for f in evaluate(run, anywindow)["findings"] if f["rule"] == "HostMemoryIncrease"]
    assert old["evidence"]["window_s"] <= loop_s + 0.5 and "is used up in" in old["message"]


# --- GPU memory: the same shape --------------------------------------------------------
@pytest.fixture()
def gpu_sim():
    from test_gpu_rules import GiB, QUIET_HOST, SAMPLE_NS, SimGPU, judge, record, well_fed

    return dict(GiB=GiB, host=QUIET_HOST, sample=SAMPLE_NS, SimGPU=SimGPU, judge=judge, record=record,
                body=well_fed)


def test_gpu_memory_that_grows_while_warming_up_is_no_leak(tmp_path, gpu_sim):
    G = gpu_sim["GiB"]

    def memory(t, frac):  # the caching allocator grows by 20 GiB, ever more slowly, towards its plateau
        return int((10 + 20 * (1 - np.exp(-frac / 0.15))) * G) + (t // gpu_sim["sample"] % 5) * (50 << 20)

    run, _ = gpu_sim["record"](tmp_path, "gpuwarm", 60, gpu_sim["body"], lambda s: gpu_sim["host"],
                               [gpu_sim["SimGPU"]()], memory_at=memory)
    used = run.system[run.system["metric"] == "gpu_memory_used"]["value"]
    assert used.max() - used.min() > 19 * G  # it did grow, by 25% of the GPU (the rule before issue 20 fired)
    result = gpu_sim["judge"](run)
    assert "GPUMemoryIncrease" not in {f["rule"] for f in result["findings"]}, result["findings"]


def test_gpu_leak_after_a_flat_warm_up_is_found_with_time_until_full(tmp_path, gpu_sim):
    G = gpu_sim["GiB"]

    def memory(t, frac):  # flat for 30% of the loop, then 20 GiB more by its end
        return int((10 + 20 * max(frac - 0.3, 0) / 0.7) * G) + (t // gpu_sim["sample"] % 5) * (50 << 20)

    run, _ = gpu_sim["record"](tmp_path, "gpulate", 60, gpu_sim["body"], lambda s: gpu_sim["host"],
                               [gpu_sim["SimGPU"]()], memory_at=memory)
    found = [f for f in gpu_sim["judge"](run)["findings"] if f["rule"] == "GPUMemoryIncrease"]
    (f,) = found
    ev = f["evidence"]
    assert ev["steps"] == [2, 59] and 14 * 1024 <= ev["growth_mb"] <= 21 * 1024
    loop_s = (run.steps["end_ns"].max() - run.steps["start_ns"].min()) / 1e9
    # the later part's rate: 20 GiB over 70% of the loop
    assert ev["rate_mb_per_min"] == pytest.approx(20 * 1024 / (0.7 * loop_s) * 60, rel=0.25)
    assert ev["time_to_full_s"] == pytest.approx(ev["free_mb"] / ev["rate_mb_per_min"] * 60, rel=0.01, abs=0.1)
    assert 40 * 1024 < ev["free_mb"] < 52 * 1024  # of 80 GiB, ~30 used at the end
    assert np.isfinite(ev["time_to_full_s"]) and "are used up in" in f["message"]


@pytest.mark.slow
def test_a_short_job_whose_memory_grows_once_says_why_it_is_not_judged(tmp_path):
    """Issue 58: no silent abstention. A short loop whose memory jumps once (a second model
    built mid-loop: a one-off change, not a similar amount every step) is too short to judge
    a trend: no finding, and rules_not_applicable names the figures that stopped the rule."""
    s, run = run_job(tmp_path, "shortjump")
    assert memory_findings(s) == [], s["findings"]
    why = s["rules_not_applicable"]["HostMemoryIncrease"]
    assert "too short to judge a trend" in why and "MB in" in why and "a line over the steps explains" in why, why
