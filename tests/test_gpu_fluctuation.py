"""LowGPUUtilization's fluctuation test (SageMaker Debugger's p95-high, p5-low check) on a
run whose GPU side is simulated on the real clock (test_gpu_rules.record)."""

from test_gpu_rules import QUIET_HOST, SimGPU, judge, phase, record, spin


def bursts(i, gpus):
    """Three steps of large kernels, then three of host-only work: the GPU swings."""
    (g,) = gpus
    with phase("Forward"):
        if (i // 3) % 2 == 0:
            for _ in range(6):
                g.launch("ampere_sgemm_128x64_tn", 6000)
        else:
            spin(36000)


def test_gpu_that_swings_between_busy_and_idle_fluctuates(tmp_path):
    run, _ = record(tmp_path, "swing", 42, bursts, lambda s: QUIET_HOST, [SimGPU()])
    found = [f for f in judge(run)["findings"] if f["evidence"].get("test") == "fluctuation"]
    assert [f["rule"] for f in found] == ["LowGPUUtilization"], judge(run)["findings"]
    (w, *_) = found[0]["evidence"]["windows"]
    assert w["p95"] >= 70 and w["p5"] <= 10
    # Debugger's names for the same thresholds: a p95 bar no GPU reaches turns the test off
    again = judge(run, {"LowGPUUtilization": {"threshold_p95": 101}})
    assert not [f for f in again["findings"] if f["evidence"].get("test") == "fluctuation"]
    assert "LowGPUUtilization.threshold_p95=101 -> fluctuation_p95=101 (same meaning)" in again["translations"]
