"""Runs recorded on a real GPU, read on the CPU.

``fixtures/gpu/h200-torch2.11-runs.tgz`` holds two runs of ``scripts/gpu_loop.py``
recorded with ``STEPSCOPE=1 STEPSCOPE_GPU=trace`` on an NVIDIA H200 (torch
2.11.0+cu130, CUPTI 13, driver 580; stepscope built there from source by the
image's gcc 13, which links libstdc++ statically):

* ``gpu-train``: ``gpu_loop.py train 10``: 10 steps of a 2-layer MLP, pinned
  batches copied with ``non_blocking=True``, ``loss.item()`` and
  ``torch.cuda.synchronize()`` each step. Steps 5-7 ran inside stepscope's
  operator window, where Kineto owned CUPTI and its records were written back.
* ``gpu-profiler``: ``gpu_loop.py profiler 8``: the program's own
  ``torch.profiler`` from step 3 to step 5; stepscope paused and resumed.

How they were made: docs/design.md, "Recording the GPU fixtures". These tests
check the decoding and attribution of real CUPTI and Kineto records, the
numbers the GPU tests (``pytest -m gpu``) check live.
"""

import json
import subprocess
import sys

import pytest

import stepscope

STEPS = 10
BATCH_BYTES = [4, 512, 64 * 1024 * 4]  # loss.item() (DtoH), y (int64) and x (float32) (HtoD)


@pytest.fixture(scope="module")
def runs(gpu_fixture_runs):
    return gpu_fixture_runs


def test_kernels_have_names_launches_steps_and_phases(runs):
    run = stepscope.load(runs / "gpu-train", quiet=True)
    assert len(run.steps) == STEPS
    k = run.kernels
    # forward (2 gemms with their split-K and epilogue kernels, relu), loss, backward, SGD: 20 a step,
    # the same inside the operator window (Kineto's records) as outside it (stepscope's own)
    assert k.groupby("step").size().to_dict() == {s: 20 for s in range(STEPS)}
    assert k["name"].str.len().gt(0).all() and (k["duration_ns"] > 0).all()
    assert k["launch_api"].isin(["cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel"]).all()
    assert (k["launch_latency_ns"] > 0).all()
    assert (k["launch_latency_ns"] < 1_000_000_000).all()  # time-bound: a recorded fixture
    assert k["phase"].astype(str).value_counts().to_dict() == {"Backward": 100, "Forward": 60, "Loss": 30,
                                                                "Optimizer": 10}
    # launch configuration: CUPTI's own records (the fixture's window kernels predate reading
    # Kineto's metadata for it)
    gemm = k[k["name"].str.contains("gemm") & ~k["step"].isin([5, 6, 7])]
    assert len(gemm) == 7 * 5  # two forward gemms (cutlass, sgemm), three backward
    assert (gemm["grid_x"] * gemm["grid_y"] * gemm["grid_z"] > 0).all()
    assert (gemm["block_x"] > 0).all() and (gemm["registers"] > 0).all()
    # every kernel runs inside its step, after its launch began
    steps = run.steps.set_index("step")
    assert (k["start_ns"] >= k["launch_start_ns"]).all()
    assert (k["launch_start_ns"].to_numpy() >= steps.loc[k["step"], "start_ns"].to_numpy()).all()


def test_copies_and_syncs_per_step(runs):
    run = stepscope.load(runs / "gpu-train", quiet=True)
    m = run.memcpy
    m = m[m["step"] >= 0]
    assert m.groupby("step")["bytes"].apply(sorted).tolist() == [BATCH_BYTES] * STEPS
    assert m["pinned"].all()  # pin_memory=True batches, and .item() into pinned memory
    assert set(m[m["bytes"] == 4]["kind"]) == {"DtoH"} and set(m[m["bytes"] > 4]["kind"]) == {"HtoD"}
    y = run.sync
    y = y[y["step"] >= 0]
    per_step = y.groupby(["step", "kind"]).size().unstack(fill_value=0)
    assert (per_step["context_synchronize"] == 1).all()  # torch.cuda.synchronize()
    assert (per_step["stream_synchronize"] == 1).all()  # loss.item()
    assert len(per_step) == STEPS


def test_operator_window_links_kernels_to_operators(runs):
    """Steps 5-7: Kineto's records, written back with its correlation ids."""
    run = stepscope.load(runs / "gpu-train", quiet=True)
    ops = run.ops
    assert sorted(set(ops["step"])) == [5, 6, 7]
    names = set(ops["name"])
    assert {"aten::addmm", "aten::mm", "Optimizer.step#SGD.step"} <= names
    assert not any(n.startswith(("cuda", "void ", "Memcpy")) for n in names)  # device records are not ops
    k = run.kernels
    window = k[k["step"].isin([5, 6, 7])]
    assert len(window) == 60 and window["launch_api"].notna().all()
    # each kernel's launching operator: the innermost op running on its thread at the launch
    from stepscope.analysis.tables.ops import kernel_ops

    linked = kernel_ops(window, run.cuda_api, ops)
    assert len(linked) == 60
    per_op = linked.groupby("op").size().to_dict()
    assert per_op["aten::addmm"] == 15 and per_op["aten::mm"] == 12  # forward and backward GEMMs, 3 steps
    assert per_op["aten::_foreach_add_"] == 3  # SGD's update, one kernel a step
    assert {"aten::nll_loss_forward", "aten::nll_loss_backward", "aten::threshold_backward"} <= set(per_op)


def test_torch_profiler_in_the_middle_pauses_and_resumes(runs):
    run = stepscope.load(runs / "gpu-profiler", quiet=True)
    assert len(run.steps) == 8
    notes = [n for n in run.notes if "torch.profiler" in n]
    assert len(notes) == 1 and "not resumed" not in notes[0]
    k = run.kernels
    # steps 3-5 belong to the program's profiler; after it, CUPTI is stepscope's again, on its clock
    assert k.groupby("step").size().to_dict() == {0: 20, 1: 20, 2: 20, 6: 20, 7: 20}


def test_summary_and_report_of_a_gpu_run(runs, tmp_path):
    out = subprocess.run([sys.executable, "-m", "stepscope", "summary", "--json", str(runs / "gpu-train")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    assert summary["steps"]["train"]["count"] == STEPS and summary["system"]["gpu_util"]["max"] >= 0
    report = tmp_path / "report.html"
    out = subprocess.run([sys.executable, "-m", "stepscope", "report", str(runs / "gpu-train"), "-o", str(report)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    html = report.read_text()
    assert "sm80_xmma_gemm" in html  # the kernel table names real kernels
