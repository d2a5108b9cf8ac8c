"""GPU activity and metrics.

CPU-only tests (this file's unmarked tests) exercise the on-disk GPU records,
their decoding and attribution with synthetic records written through the same
native path CUPTI's decoder uses, and the no-GPU paths for real.

Tests marked ``gpu`` need an NVIDIA GPU and a CUDA build of torch; they are
skipped elsewhere. Run them on a GPU machine with::

    pytest -m gpu tests/test_gpu.py
"""

import json
import os
import time

import numpy as np
import pytest

import stepscope
from stepscope.core import _native
from stepscope.core import gpu_records as rec


def _trace(session):
    return os.path.join(session.process_dir, "trace.ssc")


def _wait_flush(path, interval_s=0.05):
    """Waits until the writer's next flush has grown the file (flush interval 20 ms here)."""
    size = os.path.getsize(path)
    for _ in range(200):
        time.sleep(interval_s)
        if os.path.getsize(path) != size:
            time.sleep(interval_s)
            return os.path.getsize(path)
    return os.path.getsize(path)


def test_kernel_record_size(run_dir):
    """Bytes on disk per kernel record, measured by file growth: <= 24 (issue 6)."""
    s = stepscope.start(name="size", gpu="off", interval_ms=60000, flush_interval_ms=20)
    _native.stop_sampler()  # only GPU records may grow the file
    path = _trace(s)
    t = time.monotonic_ns()
    names = [f"void at::native::elementwise_kernel<{i}>(int)" for i in range(40)]
    rec.kernel(names[0], t, t + 1000, 1, grid=(1024, 1, 1), block=(256, 1, 1), registers=32)
    for i in range(40):  # names and configs are written once; measure the records alone
        rec.kernel(names[i], t, t + 1, 1, grid=(64 * (i % 8 + 1), 1, 1), block=(256, 1, 1), registers=32)
    size0 = _wait_flush(path)
    n = 50_000
    rng = np.random.default_rng(0)
    gaps = rng.integers(1_000, 20_000, n)        # 1-20 us between kernels of a stream
    durs = rng.integers(2_000, 2_000_000, n)      # 2 us - 2 ms
    start = t + 10_000
    for i in range(n):
        rec.kernel(names[i % 40], start, start + int(durs[i]), 2 + 2 * i, grid=(64 * (i % 8 + 1), 1, 1),
                   block=(256, 1, 1), registers=32)
        start += int(durs[i] + gaps[i])
    size1 = _wait_flush(path)
    per_record = (size1 - size0) / n
    s.stop()
    print(f"bytes per kernel record: {per_record:.2f}")
    assert per_record <= 24
    gpu = _native.read_trace(path)["gpu"]
    assert int((gpu["type"] == rec.KERNEL).sum()) == n + 41


def test_gpu_records_round_trip(run_dir):
    """Every field written through the native path comes back from the file."""
    s = stepscope.start(name="rt", gpu="off")
    t = time.monotonic_ns()
    rec.api("cudaLaunchKernel", t, t + 3_000, 11, thread=4242)
    rec.kernel("_Z6kernelPf", t + 5_000, t + 9_000, 11, device=1, stream=13, grid=(7, 2, 1), block=(128, 2, 1),
               registers=40, static_smem=256, dynamic_smem=4096)
    rec.api("cudaMemcpyAsync", t + 10_000, t + 12_000, 12)
    rec.memcpy("HtoD", 1 << 20, t + 12_000, t + 20_000, 12, device=1, stream=13, src="pinned", dst="device")
    rec.memset(4096, t + 21_000, t + 22_000, 13, device=1, stream=13)
    rec.sync("stream_synchronize", t + 22_000, t + 30_000, 14, device=1, stream=13)
    s.stop()
    c = _native.read_trace(_trace(s))
    assert c["version"] == (1, 1)
    g = c["gpu"]
    names = c["names"]
    by_type = {int(ty): i for i, ty in enumerate(g["type"])}
    k = by_type[rec.KERNEL]
    assert names[g["name"][k]] == "_Z6kernelPf"
    assert (g["start"][k] - t, g["end"][k] - t, g["correlation"][k]) == (5_000, 9_000, 11)
    assert (g["device"][k], g["stream"][k]) == (1, 13)
    assert list(g["configs"].reshape(-1, 9)[g["config"][k]]) == [7, 2, 1, 128, 2, 1, 40, 256, 4096]
    m = by_type[rec.MEMCPY]
    assert (g["sub"][m], g["sub2"][m] & 15, g["sub2"][m] >> 4, g["bytes"][m]) == (1, 2, 3, 1 << 20)
    assert g["bytes"][by_type[rec.MEMSET]] == 4096
    assert g["sub"][by_type[rec.SYNC]] == 3
    apis = np.flatnonzero(g["type"] == rec.RUNTIME)
    assert sorted(names[g["name"][i]] for i in apis) == ["cudaLaunchKernel", "cudaMemcpyAsync"]
    assert 4242 in g["thread"][apis]
    kinds = {name: kind for _, _, kind, name in c["tracks"]}
    assert kinds["GPU 1 stream 13"] == 1 and kinds["CUDA API"] == 2
    assert c["written"] >= 6 and c["dropped"] == 0


def test_gpu_record_needs_a_session():
    t = time.monotonic_ns()
    assert rec.kernel("k", t, t + 1, 1) is False  # no session: nothing queued, no error


def _synthetic_training(steps=3, latency_ns=3_000_000):
    """Steps of Forward/Backward/Optimizer on the host; each phase launches one kernel
    (from a second thread for Backward, as PyTorch's autograd engine does) that the
    'GPU' runs latency_ns later, usually in a later phase. Returns the expectations."""
    import threading

    launches = []
    corr = 100
    for step in range(steps):
        stepscope.step()
        for phase in ("Forward", "Backward", "Optimizer"):
            with stepscope.phase(phase):
                corr += 1
                t0 = time.monotonic_ns()

                def launch(c=corr, t=t0):
                    rec.api("cudaLaunchKernel", t, t + 4_000, c, thread=threading.get_native_id())

                if phase == "Backward":
                    worker = threading.Thread(target=launch)
                    worker.start()
                    worker.join()
                else:
                    launch()
                launches.append((corr, step, phase, t0))
                time.sleep(0.004)
    stepscope.end_step()
    names = {"Forward": "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<c10::BFloat16> >(int)",
             "Backward": "ampere_sgemm_128x64_tn", "Optimizer": "_Z25multi_tensor_apply_kernelIfEvPT_"}
    for corr, step, phase, t0 in launches:
        start = t0 + latency_ns
        rec.kernel(names[phase], start, start + 50_000, corr, stream=7, grid=(80, 1, 1), block=(128, 1, 1),
                   registers=64, dynamic_smem=2048)
    t = time.monotonic_ns()
    rec.kernel("orphan_kernel", t, t + 1000, 99_999)  # its launch was never recorded
    return launches


def test_kernels_linked_to_launch_step_and_phase(run_dir):
    s = stepscope.start(name="attr", gpu="off")
    launches = _synthetic_training()
    s.stop()
    run = stepscope.load(s.path)
    k = run.kernels
    assert len(k) == len(launches) + 1
    by_corr = k.set_index("correlation")
    for corr, step, phase, t0 in launches:
        row = by_corr.loc[corr]
        assert (row["step"], row["phase"], row["mode"]) == (step, phase, "train")
        assert row["launch_api"] == "cudaLaunchKernel"
        assert row["launch_latency_ns"] == 3_000_000
        assert row["duration_ns"] == 50_000
        assert (row["grid_x"], row["block_x"], row["registers"], row["dynamic_smem"]) == (80, 128, 64, 2048)
    orphan = by_corr.loc[99_999]
    assert orphan["step"] == -1 and pd_isna(orphan["phase"]) and pd_isna(orphan["launch_start_ns"])
    assert set(k["precision"]) == {"BF16", "FP32", "unknown"}
    assert by_corr.loc[launches[2][0], "name"] == "void multi_tensor_apply_kernel<float>(float*)"  # demangled
    assert by_corr.loc[launches[2][0], "mangled"].startswith("_Z25")
    # Kernel start times are on the run's wall clock, like the phases that launched them.
    ph = run.phases.set_index(["step", "name"])
    first = by_corr.loc[launches[0][0]]
    assert ph.loc[(0, "Forward"), "start_ns"] <= first["launch_start_ns"] <= ph.loc[(0, "Forward"), "end_ns"]
    assert len(run.cuda_api) == len(launches)
    assert run.sql("select count(*) as n from kernels where phase = 'Backward'")["n"][0] == 3


def pd_isna(v):
    import pandas as pd

    return pd.isna(v)


def test_memcpy_memset_sync_tables(run_dir):
    s = stepscope.start(name="copies", gpu="off")
    stepscope.step()
    with stepscope.phase("GetNext"):
        t = time.monotonic_ns()
        rec.api("cudaMemcpyAsync", t, t + 2_000, 1)
        rec.api("cudaMemsetAsync", t + 3_000, t + 4_000, 2)
        rec.api("cudaStreamSynchronize", t + 5_000, t + 900_000, 3)
        time.sleep(0.002)
    stepscope.end_step()
    rec.memcpy("HtoD", 3 * 224 * 224 * 4 * 32, t + 10_000, t + 410_000, 1, src="pinned", dst="device")
    rec.memcpy("DtoD", 4096, t + 420_000, t + 421_000, 4)
    rec.memset(1 << 16, t + 430_000, t + 431_000, 2)
    rec.sync("stream_synchronize", t + 5_000, t + 900_000, 3, stream=7)
    rec.sync("context_synchronize", t + 950_000, t + 960_000, 5)
    s.stop()
    run = stepscope.load(s.path)
    m = run.memcpy.set_index("correlation")
    assert m.loc[1, "kind"] == "HtoD" and m.loc[1, "bytes"] == 3 * 224 * 224 * 4 * 32
    assert bool(m.loc[1, "pinned"]) and m.loc[1, "phase"] == "GetNext" and m.loc[1, "step"] == 0
    assert m.loc[1, "bytes_per_s"] == pytest.approx(m.loc[1, "bytes"] / 400e-6)
    assert pd_isna(m.loc[4, "pinned"]) and m.loc[4, "kind"] == "DtoD" and m.loc[4, "step"] == -1
    ms = run.memset.iloc[0]
    assert (ms["bytes"], ms["memory"], ms["phase"]) == (1 << 16, "device", "GetNext")
    y = run.sync.set_index("correlation")
    assert y.loc[3, "kind"] == "stream_synchronize" and y.loc[3, "stream"] == 7
    assert y.loc[3, "launch_api"] == "cudaStreamSynchronize" and y.loc[3, "duration_ns"] == 895_000
    assert y.loc[3, "phase"] == "GetNext"
    assert y.loc[5, "kind"] == "context_synchronize" and y.loc[5, "stream"] == -1


def test_gpu_tables_survive_the_parquet_cache(run_dir):
    s = stepscope.start(name="cached", gpu="off")
    launches = _synthetic_training(steps=2)
    s.stop()
    first = stepscope.load(s.path).kernels
    for t in threading_enumerate_cache_writers():
        t.join()
    again = stepscope.load(s.path)
    assert getattr(again, "_from_cache", False)
    second = again.kernels
    assert len(second) == len(first) == len(launches) + 1
    assert (second["step"].to_numpy() == first["step"].to_numpy()).all()
    assert (second["start_ns"].to_numpy() == first["start_ns"].to_numpy()).all()


def threading_enumerate_cache_writers():
    import threading

    return [t for t in threading.enumerate() if t.name == "stepscope-parquet-cache"]


def test_runs_without_gpu_records_have_empty_gpu_tables(run_dir):
    s = stepscope.start(name="cpu-only", gpu="off")
    stepscope.step()
    stepscope.end_step()
    s.stop()
    run = stepscope.load(s.path)
    from stepscope.analysis.gpu import KERNEL_COLUMNS, MEMCPY_COLUMNS, SYNC_COLUMNS

    assert run.kernels.empty and list(run.kernels.columns) == KERNEL_COLUMNS
    assert run.memcpy.empty and list(run.memcpy.columns) == MEMCPY_COLUMNS
    assert run.sync.empty and list(run.sync.columns) == SYNC_COLUMNS
    assert run.memset.empty and run.cuda_api.empty


@pytest.mark.parametrize("name,cls", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "BF16"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", "FP16"),
    ("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", "TF32"),
    ("ampere_sgemm_128x64_tn", "FP32"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::Half> >(int)", "FP16"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> > >", "FP32"),
    ("sm89_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n", "FP8"),
    ("void cutlass::Kernel<cutlass_80_tensorop_i16832gemm_s8_256x128_64x3_tn_align16>(int8_t)", "INT8"),
    ("volta_dgemm_64x64_nn", "FP64"),
    ("triton_poi_fused_add_0", "unknown"),
])
def test_precision_from_kernel_names(name, cls):
    from stepscope.analysis.gpu import precision_of

    assert precision_of(name) == cls
