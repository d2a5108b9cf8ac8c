"""The native per-step kernel aggregates equal their definition (analysis/tables/kernel_steps.py).

``kernel_steps.aggregate(kernels)`` runs the native pass (csrc/aggregate/kernel_steps.cc);
``native=False`` runs ``_steps``' pandas group-by, which defines the figures. Both
tables (per step, per step and phase) must match column for column on random kernel
tables (several processes and devices, overlapping kernels on several streams, steps
interleaved on the GPU, kernels without a step's mode or a phase, launches not found,
NCCL kernels left out) and on the kernels of the runs recorded on a real GPU.
"""

import os
import sys
import tarfile

import numpy as np
import pandas as pd
import pytest

import stepscope
from stepscope.analysis.tables import kernel_steps


def assert_same(kernels: pd.DataFrame) -> None:
    native = kernel_steps.aggregate(kernels)
    reference = kernel_steps.aggregate(kernels, native=False)
    for table in ("kernel_steps", "kernel_phases", "kernel_names"):
        pd.testing.assert_frame_equal(native[table], reference[table], obj=table)


def random_kernels(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(int(rng.integers(1, 4))):
        rank = pd.NA if rng.random() < 0.2 else p
        for device in range(int(rng.integers(1, 3))):
            at = int(rng.integers(0, 10_000))
            step = int(rng.integers(0, 3))
            for _ in range(int(rng.integers(0, 300))):
                if rng.random() < 0.08:
                    step += 1
                length = int(rng.integers(0, 5_000))
                start = at + int(rng.integers(-2_000, 300_000 if rng.random() < 0.05 else 3_000))
                at = max(at, start)
                launched = pd.NA if rng.random() < 0.1 else start - int(rng.integers(-30_000, 400_000))
                rows.append({
                    "process": f"p{p}", "rank": rank, "device": device, "stream": int(rng.integers(7, 10)),
                    "name": "ncclKernel_AllReduce" if rng.random() < 0.05 else f"k{int(rng.integers(0, 4))}",
                    "start_ns": start, "end_ns": start + length, "duration_ns": length,
                    "step": step - int(rng.random() < 0.05),  # a kernel of the step before, late on the GPU
                    "mode": None if rng.random() < 0.05 else ("train" if rng.random() < 0.9 else "eval"),
                    "phase": None if rng.random() < 0.1 else str(rng.choice(["Forward", "Backward", "Optimizer"])),
                    "precision": "FP32", "launch_start_ns": launched,
                    "launch_latency_ns": pd.NA if launched is pd.NA else start - launched})
    k = pd.DataFrame(rows, columns=["process", "rank", "device", "stream", "name", "start_ns", "end_ns",
                                    "duration_ns", "step", "mode", "phase", "precision", "launch_start_ns",
                                    "launch_latency_ns"])
    k = k.sample(frac=1.0, random_state=seed).reset_index(drop=True) if len(k) and seed % 2 else k
    for c in ("process", "name", "mode", "phase", "precision"):
        k[c] = k[c].astype("category")
    for c in ("rank", "launch_start_ns", "launch_latency_ns"):
        k[c] = k[c].astype("Int64")
    for c in ("device", "stream", "start_ns", "end_ns", "duration_ns", "step"):
        k[c] = k[c].astype(np.int64)
    return k


@pytest.mark.parametrize("seed", range(120))
def test_random_kernel_tables(seed):
    assert_same(random_kernels(seed))


@pytest.mark.slow
def test_the_random_tables_reach_every_edge():
    seen = set()
    for seed in range(120):
        s = kernel_steps.aggregate(random_kernels(seed), native=False)["kernel_steps"]
        if len(s):
            seen.add("steps")
            seen.update(x for x, hit in (("launch gaps", (s["launch_gaps"] > 0).any()),
                                         ("no launch gap", s["launch_gap_ns_median"].isna().any()),
                                         ("no mode", s["mode"].isna().any()),
                                         ("several processes", s["process"].nunique() > 1),
                                         ("no rank", s["rank"].isna().any()),
                                         ("busy below the sum", (s["busy_ns"] < s["kernel_ns"]).any())) if hit)
    assert seen == {"steps", "launch gaps", "no launch gap", "no mode", "several processes", "no rank",
                    "busy below the sum"}, seen


def test_the_gpu_fixture_runs(tmp_path):
    archive = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "gpu", "h200-torch2.11-runs.tgz")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data") if sys.version_info >= (3, 12) else tar.extractall(tmp_path)
    for d in sorted(os.listdir(tmp_path)):
        kernels = stepscope.load(os.path.join(tmp_path, d), cache=False, quiet=True).kernels
        assert len(kernels) >= 50
        assert len(kernel_steps.aggregate(kernels)["kernel_steps"]) >= 5
        assert_same(kernels)
