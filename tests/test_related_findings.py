"""One problem, one finding (relate.py): a finding another one explains is listed under it, each
finding costs ms per step, and two independent problems stay two findings. GPU-shaped runs are
synthetic (test_gpu_rules.SimGPU), every timestamp the simulation's: they hold on a busy machine."""

import pytest

from test_gpu_rules import GiB, QUIET_HOST, SimGPU, judge, launch_bound, phase, record, spin


@pytest.fixture(autouse=True)
def _no_floor_on_the_total(monkeypatch):
    """The simulated runs are 30-48 steps of a few ms, shorter than any real GPU job: judged
    without the floor on a finding's total over the run (tests/test_rules.py holds it)."""
    from stepscope.analysis.rules import base

    monkeypatch.setattr(base, "MIN_TOTAL_S", 0.0)


def rules(findings):
    return sorted(f["rule"] for f in findings)


def primary(result, rule):
    (f,) = [f for f in result["findings"] if f["rule"] == rule]
    return f


def test_launch_bound_job_keeps_the_busy_launching_thread_under_kernel_launch_bound(tmp_path):
    # the training process at 100% of a core (it launches kernels all the time), the other cores idle
    run, _ = record(tmp_path, "launch", 30, launch_bound, lambda s: dict(cores_busy=20.0, process=100.0),
                    [SimGPU()])
    result = judge(run)
    assert rules(result["findings"]) == ["KernelLaunchBound"], result["findings"]
    (cpu,) = result["related_findings"]
    assert cpu["rule"] == "CPUBottleneck" and cpu["related_to"]["rule"] == "KernelLaunchBound"
    assert "launches the kernels" in cpu["related_to"]["why"]
    f = primary(result, "KernelLaunchBound")
    assert [e["rule"] for e in f["explains"]] == ["CPUBottleneck"]
    step = f["evidence"]["step_ms_mean"]
    # the cost is the launch gaps per step (a loaded test machine stretches some gaps past max_gap_ms)
    by_phase = f["evidence"]["launch_gap_ms_per_step_by_phase"]
    assert 0 < f["cost_ms_per_step"] < step and f["cost_ms_per_step"] == pytest.approx(sum(by_phase.values()),
                                                                                      abs=0.01)
    assert cpu["cost_ms_per_step"] > 0


def test_launch_bound_job_on_a_saturated_host_has_two_problems(tmp_path):
    # every core busy: launching keeps one thread busy, not the whole host, so CPUBottleneck is its own problem
    run, _ = record(tmp_path, "launch-busy", 30, launch_bound, lambda s: dict(cores_busy=97.0, process=100.0),
                    [SimGPU()])
    result = judge(run)
    assert rules(result["findings"]) == ["CPUBottleneck", "KernelLaunchBound"], result["findings"]
    assert result["related_findings"] == []
    assert all(f["explains"] == [] and f["cost_ms_per_step"] > 0 for f in result["findings"])


def slow_loader(i, gpus):
    """No loader workers: the training process decodes each batch itself in GetNext."""
    (g,) = gpus
    with phase("GetNext"):
        spin(6000)
    with phase("Forward"):
        g.launch("ampere_sgemm_128x64_tn", 1000)
    with phase("Backward"):
        g.launch("ampere_sgemm_128x64_nt", 1000)


def test_slow_loader_job_is_one_get_next_finding(tmp_path):
    run, _ = record(tmp_path, "loader", 30, slow_loader, lambda s: dict(cores_busy=20.0, process=100.0),
                    [SimGPU()])
    result = judge(run)
    assert rules(result["findings"]) == ["GetNextBottleneck"], result["findings"]
    assert rules(result["related_findings"]) == ["CPUBottleneck", "Dataloader"]
    assert all(r["related_to"]["rule"] == "GetNextBottleneck" for r in result["related_findings"])
    f = primary(result, "GetNextBottleneck")
    assert f["cost_ms_per_step"] == f["evidence"]["getnext_ms_mean"] and f["cost_ms_per_step"] >= 6
    assert sorted(e["rule"] for e in f["explains"]) == ["CPUBottleneck", "Dataloader"]
    # the rules table (Debugger's ProfilerReport) still says CPUBottleneck triggered, and that it is related
    (row,) = [r for r in result["details"]["ProfilerReport"]["rules"] if r["rule"] == "CPUBottleneck"]
    assert row["triggered"] == 1 and row["related"] == 1
    # the report's verdict shows the one problem with its cost, and what it explains under it
    from stepscope.analysis.report.page import _verdict

    verdict = _verdict(result)
    assert verdict.count("<h3>") == 1 and "GetNextBottleneck" in verdict
    assert f"costs {f['cost_ms_per_step']:.3g} ms a step" in verdict
    assert "because of this" in verdict and "CPUBottleneck" in verdict


def syncing_loop(work_after_sync_us):
    """well_fed with loss.item() after the loss, then `work_after_sync_us` of host work before backward."""

    def body(i, gpus):
        (g,) = gpus
        with phase("GetNext"):
            spin(200)
        with phase("Forward"):
            for _ in range(3):
                g.launch("ampere_sgemm_128x64_tn", 1500)
        with phase("Loss"):
            g.launch("nll_loss_forward_reduce_cuda_kernel_2d", 300)
            g.item()
            spin(work_after_sync_us)
        with phase("Backward"):
            for _ in range(4):
                g.launch("ampere_sgemm_128x64_nt", 1500)
        with phase("Optimizer"):
            g.launch("multi_tensor_apply_kernel", 500)

    return body


def leaking(t, frac):
    return int((10 + 20 * frac) * GiB) + (t // 20_000_000 % 5) * (50 << 20)


def test_leak_with_a_deliberate_sync_is_one_memory_finding(tmp_path):
    run, _ = record(tmp_path, "leak-sync", 40, syncing_loop(0), lambda s: QUIET_HOST, [SimGPU()],
                    memory_at=leaking)
    result = judge(run)
    assert rules(result["findings"]) == ["GPUMemoryIncrease"], result["findings"]
    assert primary(result, "GPUMemoryIncrease")["cost_ms_per_step"] is None  # memory, not time
    # the GPU idles a few microseconds after each sync: below the cost floor (SPEC §7), the
    # sync is no finding, related or alone (issue 47)
    (sync,) = result["below_cost_floor"]
    assert sync["rule"] == "HostSyncStall" and sync["cost_ms_per_step"] < sync["floor_ms"]
    assert result["related_findings"] == []
    alone = judge(run, {"GPUMemoryIncrease": {"min_increase_percent": 90}})
    assert alone["findings"] == [] and [b["rule"] for b in alone["below_cost_floor"]] == ["HostSyncStall"]


def test_leak_and_a_costly_sync_are_two_problems(tmp_path):
    # after each .item() the host works 4 ms before it launches backward: the GPU idles that long
    run, _ = record(tmp_path, "leak-stall", 40, syncing_loop(4000), lambda s: QUIET_HOST, [SimGPU()],
                    memory_at=leaking)
    result = judge(run)
    assert rules(result["findings"]) == ["GPUMemoryIncrease", "HostSyncStall"], result["findings"]
    assert result["related_findings"] == []
    assert primary(result, "HostSyncStall")["cost_ms_per_step"] == pytest.approx(4, abs=1.5)


def test_summary_text_names_the_related_finding(tmp_path):
    from stepscope.analysis.report.summary import format_text, summarize

    run, _ = record(tmp_path, "loader-text", 30, slow_loader, lambda s: dict(cores_busy=20.0, process=100.0),
                    [SimGPU()])
    s = summarize(run, {"StepOutlier": {"min_excess_s": 1.0}})
    assert rules(s["related_findings"]) == ["CPUBottleneck", "Dataloader"]
    text = format_text(s)
    assert text.count("[GetNextBottleneck]") == 1 and "[CPUBottleneck]" not in text
    assert "would save about" in text and "(also CPUBottleneck, because of this:" in text


def test_diff_shows_each_problem_once_with_its_cost(tmp_path):
    from stepscope.analysis.report.diff import diff, format_diff

    _, loader = record(tmp_path, "loader-a", 30, slow_loader, lambda s: dict(cores_busy=20.0, process=100.0),
                       [SimGPU()])
    _, launch = record(tmp_path, "launch-b", 30, launch_bound, lambda s: dict(cores_busy=20.0, process=100.0),
                       [SimGPU()])
    d = diff(loader, launch, {"StepOutlier": {"min_excess_s": 1.0}})
    f = d["findings"]
    assert f["a"] == ["GetNextBottleneck"] and f["b"] == ["KernelLaunchBound"], f
    assert f["cleared"] == ["GetNextBottleneck"] and f["new"] == ["KernelLaunchBound"]
    (ga, gb), (ka, kb) = f["cost_ms_per_step"]["GetNextBottleneck"], f["cost_ms_per_step"]["KernelLaunchBound"]
    assert ga >= 6 and gb is None and ka is None and kb > 1
    assert "KernelLaunchBound: - -> " in format_diff(d)


def loader_then_cpu(i, gpus):
    """A slow loader for the first half of the run, then Python work inside the model."""
    if i < 24:
        return slow_loader(i, gpus)
    (g,) = gpus
    with phase("GetNext"):
        spin(100)
    with phase("Forward"):
        spin(8000)
        g.launch("ampere_sgemm_128x64_tn", 600)
    with phase("Backward"):
        g.launch("ampere_sgemm_128x64_nt", 600)


def test_a_loader_and_a_later_cpu_problem_are_two_findings(tmp_path):
    # the host is quiet while the loader waits (on the network, say), then every core is busy
    run, _ = record(tmp_path, "halves", 48, loader_then_cpu,
                    lambda s: QUIET_HOST if s < 24 else dict(cores_busy=97.0, process=100.0), [SimGPU()])
    windows = {r: {"window_s": 0.05} for r in ("CPUBottleneck", "BatchSize", "LowGPUUtilization", "IOBottleneck")}
    result = judge(run, windows)
    assert rules(result["findings"]) == ["CPUBottleneck", "GetNextBottleneck"], result["findings"]
    assert primary(result, "CPUBottleneck")["explains"] == []
    # the GPU's idle windows of the first half are the loader's: BatchSize rides along with it
    assert rules(result["related_findings"]) == ["BatchSize", "Dataloader"]
    assert {r["related_to"]["rule"] for r in result["related_findings"]} == {"GetNextBottleneck"}
