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
    # 1.1 GPU chunks, 1.2 Python samples, 1.3 CRC over chunk headers, 1.4 interrupted marks
    assert c["version"] == (1, 4)
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
    names = {"Forward": "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<c10::BFloat16> >"
                        "(int)",
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


def test_launch_lookup_takes_the_first_call_of_a_correlation_id(run_dir):
    """Launches are found by correlation id in a sorted array (analysis/store/gpu_raw.py): records
    written out of time order still find theirs, an id two API calls carry resolves to the
    earlier call, and the string columns of the large tables are categorical."""
    import pandas as pd

    s = stepscope.start(name="lookup", gpu="off")
    t = time.monotonic_ns()
    # kernels first, their launches after (as CUPTI's activity buffers may hand them over)
    for i in range(5):
        rec.kernel(f"kernel_{i % 2}", t + 100_000 * i + 50_000, t + 100_000 * i + 60_000, 100 + i)
    for i in reversed(range(5)):
        rec.api("cudaLaunchKernel", t + 100_000 * i, t + 100_000 * i + 2_000, 100 + i)
    rec.api("cudaLaunchKernelExC", t + 600_000, t + 602_000, 102)  # the same id again, later
    s.stop()
    k = stepscope.load(s.path, cache=False).kernels.set_index("correlation").sort_index()
    assert list(k.index) == [100, 101, 102, 103, 104]
    assert (k["launch_api"] == "cudaLaunchKernel").all()
    assert list(k["launch_latency_ns"]) == [50_000] * 5
    assert list(k["name"]) == ["kernel_0", "kernel_1"] * 2 + ["kernel_0"]
    for column in ("name", "mangled", "precision", "mode", "phase", "launch_api"):
        assert isinstance(k[column].dtype, pd.CategoricalDtype), column


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
    assert again._store.from_cache
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
    from stepscope.analysis.store.schema import KERNEL_COLUMNS, MEMCPY_COLUMNS, SYNC_COLUMNS

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
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> > >",
     "FP32"),
    ("sm89_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n", "FP8"),
    ("void cutlass::Kernel<cutlass_80_tensorop_i16832gemm_s8_256x128_64x3_tn_align16>(int8_t)", "INT8"),
    ("volta_dgemm_64x64_nn", "FP64"),
    ("triton_poi_fused_add_0", "unknown"),
])
def test_precision_from_kernel_names(name, cls):
    from stepscope.analysis.tables.gpu import precision_of

    assert precision_of(name) == cls


# --- no GPU here: the real paths ---------------------------------------------------
def _has_nvidia_driver():
    from stepscope.core.gpu import driver_present

    return driver_present()


no_driver = pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has an NVIDIA driver")


def _gpu_notes(run_path):
    with open(os.path.join(run_path, "run.json")) as f:
        return [n for n in json.load(f).get("notes", []) if "GPU" in n]


@no_driver
@pytest.mark.parametrize("mode", ["auto", "metrics", "trace"])
def test_no_gpu_gives_one_note_and_no_error(tmp_path, mode):
    """On a machine without an NVIDIA driver each GPU mode records one note, prints
    nothing, and the job's output is unchanged. `trace` really loads libcupti where the
    CUDA toolkit has one, and CUPTI really fails for want of a driver."""
    from conftest import run_python

    r = run_python(f"""
        import stepscope
        with stepscope.profile(dir={str(tmp_path)!r}, name="r", gpu={mode!r}) as s:
            stepscope.step()
            print("done", sum(range(10)))
        """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "done 45\n" and r.stderr == ""
    notes = _gpu_notes(tmp_path / "r")
    assert len(notes) == 1, notes
    if mode == "auto":
        assert "no NVIDIA driver" in notes[0]
    elif mode == "metrics":
        assert "metrics off" in notes[0] and "activity" not in notes[0]
    else:
        assert "metrics off" in notes[0] and "activity tracing off" in notes[0]
    run = stepscope.load(str(tmp_path / "r"))
    assert not run.system["metric"].str.startswith("gpu").any()
    assert run.kernels.empty


def test_gpu_off_gives_no_note(tmp_path):
    s = stepscope.start(dir=str(tmp_path), name="off", gpu="off")
    s.stop()
    assert _gpu_notes(tmp_path / "off") == []


@no_driver
def test_cupti_without_driver_is_a_quiet_failure():
    """The real libcupti of the CUDA toolkit, with no driver: CUPTI fails, we say why."""
    from stepscope.core.gpu import find_cupti

    present = [p for p in find_cupti() if os.path.isabs(p) and os.path.exists(p)]
    if not present:
        pytest.skip("no libcupti on this machine")
    ok, no_device, message = _native.cupti_start(present[0])
    assert not ok and no_device and "libcuda.so.1" in message
    assert not _native.cupti_status()["active"]
    _native.cupti_stop()  # harmless when not started


def test_cupti_record_layout_matches_the_headers(tmp_path):
    """The byte offsets the decoder reads are those of CUPTI's own headers (where a CUDA
    toolkit is installed; the build itself needs none)."""
    import glob
    import shutil
    import subprocess

    headers = sorted(glob.glob("/usr/local/cuda*/include/cupti_activity.h"))
    if not headers or not shutil.which("c++"):
        pytest.skip("no CUDA toolkit headers here")
    layout = _native.cupti_layout()
    lines = [f'printf("%s %zu\\n", "{k}", offsetof({k.split(".")[0]}, {k.split(".")[1]}));' for k in layout]
    src = tmp_path / "layout.cc"
    src.write_text("#include <cstddef>\n#include <cstdio>\n#include <cupti_activity.h>\nint main(){\n"
                   + "\n".join(lines) + "\n}\n")
    exe = tmp_path / "layout"
    subprocess.run(["c++", f"-I{os.path.dirname(headers[-1])}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    actual = dict((k, int(v)) for k, v in (line.split() for line in out if line))
    assert actual == dict(layout)


# --- NVML metrics in the system table ---------------------------------------------
def _write_nvml_samples(session, samples=5, interval_ns=100_000_000):
    """Counters as core/gpu_metrics.py records them, for two GPUs."""
    system = _native.CATEGORIES.index("system")
    tpn = _native.clock_info()["ticks_per_ns"]
    t0 = _native.now()
    for i in range(samples):
        at = t0 + int(i * interval_ns * tpn)
        for dev in (0, 1):
            values = {"util": 40 + 10 * dev + i, "mem_util": 20 + dev, "mem_used": (1 + dev) << 30,
                      "mem_total": 80 << 30, "power_mw": 300_000 + 1000 * i, "energy_mj": 1_000_000 + 30_000 * i,
                      "temp": 60, "sm_clock": 1980, "throttle": 0, "pcie_tx_bytes": i * 50_000_000,
                      "pcie_rx_bytes": i * 10_000_000, "nvlink_tx_kib": i * 1000, "nvlink_rx_kib": 0}
            for metric, v in values.items():
                _native.counter(system, _native.intern(f"gpu.{metric}|gpu{dev}"), float(v), None, at)
    return t0


def test_nvml_counters_become_system_metrics(run_dir):
    s = stepscope.start(name="nvml", gpu="off", interval_ms=60000)
    _write_nvml_samples(s)
    s.stop()
    run = stepscope.load(s.path)
    sysm = run.system
    g = sysm[sysm["metric"].str.startswith("gpu")]
    util = g[(g["metric"] == "gpu_util") & (g["device"] == "gpu1")]["value"].tolist()
    assert util == [50, 51, 52, 53, 54]
    power = g[(g["metric"] == "gpu_power") & (g["device"] == "gpu0")]["value"]
    assert power.iloc[0] == pytest.approx(300.0)
    pcie = g[(g["metric"] == "gpu_pcie_tx_bytes_per_s") & (g["device"] == "gpu0")]["value"]
    assert len(pcie) == 4 and pcie.to_numpy() == pytest.approx(5e8, rel=0.02)
    nvl = g[(g["metric"] == "gpu_nvlink_tx_bytes_per_s") & (g["device"] == "gpu0")]["value"]
    assert nvl.to_numpy() == pytest.approx(1000 * 1024 / 0.1, rel=0.02)
    assert set(g[g["metric"] == "gpu_memory_used_percent"]["value"].round(3)) == {1.25, 2.5}
    assert set(g["unit"][g["metric"] == "gpu_power"]) == {"W"}
    from stepscope.analysis.tables.system import summarize_system

    summary = summarize_system(sysm)
    assert summary["gpu_util_mean"] == pytest.approx(np.mean([40, 41, 42, 43, 44, 50, 51, 52, 53, 54]))
    from stepscope.compat.smdebug import PandasFrame

    pf = PandasFrame(s.path).get_all_system_metrics()
    gpus = pf[pf["type"] == "gpu"]
    assert set(gpus["system_metric"]) == {"gpu0", "gpu1"}
    assert set(gpus["dimension"]) == {"GPUUtilization", "GPUMemoryUtilization"}
    assert gpus[(gpus["system_metric"] == "gpu0") & (gpus["dimension"] == "GPUUtilization")]["value"].tolist() \
        == [40, 41, 42, 43, 44]


# --- on a GPU (pytest -m gpu) -----------------------------------------------------
def _cuda_available():
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


gpu_only = pytest.mark.skipif(not _has_nvidia_driver() or not _cuda_available(),
                              reason="needs an NVIDIA GPU and a CUDA build of torch")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "gpu_loop.py")


def _run_gpu_script(tmp_path, *args, name="gpu", **env):
    import subprocess
    import sys

    full = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    full.update({"STEPSCOPE": "1", "STEPSCOPE_DIR": str(tmp_path / "runs"), "STEPSCOPE_RUN": name,
                 "STEPSCOPE_GPU": "trace"}, **env)
    r = subprocess.run([sys.executable, SCRIPT, *args], cwd=tmp_path, env=full, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stepscope:" not in r.stderr, r.stderr[-3000:]
    return r, stepscope.load(str(tmp_path / "runs" / name))


STEPS = 12


@pytest.mark.gpu
@gpu_only
def test_gpu_training_loop(tmp_path):
    """Issue 6, done-when 1: kernels with names, streams and durations, each linked to its
    launch and to a step and phase; memcpy bytes equal to the tensors moved; syncs from
    .item() and torch.cuda.synchronize()."""
    r, run = _run_gpu_script(tmp_path, "train", str(STEPS))
    assert r.stdout.count("loss") == STEPS
    steps = run.steps
    assert len(steps) == STEPS
    k = run.kernels
    first, last = steps["start_ns"].min(), steps["end_ns"].max()
    in_loop = k[(k["launch_start_ns"] >= first) & (k["launch_start_ns"] < last)]
    assert len(in_loop) >= STEPS * 10  # forward, backward and SGD kernels every step
    assert k["name"].str.len().gt(0).all() and (k["duration_ns"] > 0).all() and k["stream"].notna().all()
    assert in_loop["launch_api"].notna().all() and (in_loop["step"] >= 0).all()
    assert set(in_loop["step"]) == set(range(STEPS))
    assert {"Forward", "Backward", "Optimizer"} <= set(in_loop["phase"].dropna())
    assert in_loop["phase"].notna().mean() >= 0.9, in_loop[in_loop["phase"].isna()]["name"].value_counts()
    assert (in_loop["launch_latency_ns"] > 0).all()
    m = run.memcpy
    htod = m[(m["kind"] == "HtoD") & (m["step"] >= 0)]
    per_step = htod.groupby("step")["bytes"].apply(sorted).tolist()
    assert per_step == [[512, 64 * 1024 * 4]] * STEPS  # y (int64) and x (float32), every step
    assert htod["pinned"].all()
    dtoh = m[(m["kind"] == "DtoH") & (m["step"] >= 0)]
    assert (dtoh.groupby("step").size() >= 1).all() and len(dtoh) >= STEPS  # loss.item()
    y = run.sync
    y = y[y["step"] >= 0]
    assert (y["kind"] == "context_synchronize").sum() >= STEPS  # torch.cuda.synchronize()
    assert y["kind"].isin(["stream_synchronize", "event_synchronize"]).sum() >= STEPS  # .item()


@pytest.mark.gpu
@gpu_only
def test_nvml_utilization_agrees_with_kernel_busy_time(tmp_path):
    """Issue 6, done-when 2: within 15 points on a steady load."""
    _, run = _run_gpu_script(tmp_path, "steady", "6", name="steady")
    k = run.kernels
    k = k[k["device"] == k["device"].iloc[0]]
    device = f"gpu{int(k['device'].iloc[0])}"
    start, end = k["start_ns"].min() + 1_000_000_000, k["end_ns"].max() - 500_000_000  # the steady part
    s, e = k["start_ns"].clip(start, end).to_numpy(), k["end_ns"].clip(start, end).to_numpy()
    order = np.argsort(s)
    busy, reach = 0, start
    for a, b in zip(s[order], e[order]):
        if b > reach:
            busy += b - max(a, reach)
            reach = b
    busy_pct = 100 * busy / (end - start)
    sysm = run.system
    util = sysm[(sysm["metric"] == "gpu_util") & (sysm["device"] == device)
                & (sysm["timestamp_ns"] >= start) & (sysm["timestamp_ns"] <= end)]["value"]
    assert len(util) >= 20
    assert abs(util.mean() - busy_pct) <= 15, (util.mean(), busy_pct)
    # energy and the driver's samples: read once a second (each costs milliseconds of CPU)
    mine = sysm[sysm["device"] == device]
    ours = mine[mine["metric"] == "gpu_util"]["timestamp_ns"]
    span_s = (ours.max() - ours.min()) / 1e9
    energy = mine[mine["metric"] == "gpu_energy"]
    assert span_s / 1.5 <= len(energy) <= span_s + 2, (len(energy), span_s)
    driver = mine[mine["metric"] == "gpu_util_driver"]["timestamp_ns"]
    assert len(driver) >= len(energy) and driver.min() >= ours.min() - 1_000_000_000  # none from before the run


@pytest.mark.gpu
@gpu_only
def test_torch_profiler_in_the_middle(tmp_path):
    """Issue 6, done-when 5: torch.profiler opened mid-run; both have their data."""
    r, run = _run_gpu_script(tmp_path, "profiler", "8", name="prof")
    assert "profiler events" in r.stdout and int(r.stdout.split("profiler events")[1].split()[0]) > 0
    notes = [n for n in run.notes if "torch.profiler" in n]
    assert len(notes) == 1 and "not resumed" not in notes[0]
    k = run.kernels
    steps_with_kernels = set(k[k["step"] >= 0]["step"])
    assert {0, 1, 2, 6, 7} <= steps_with_kernels  # before and after the profiler's window


@pytest.mark.gpu
@gpu_only
def test_cupti_clock_matches_the_host_clock(tmp_path):
    """Every kernel starts after its launch call started (same clock, mapped right)."""
    _, run = _run_gpu_script(tmp_path, "train", "4", name="clock")
    k = run.kernels.dropna(subset=["launch_start_ns"])
    assert len(k) and (k["launch_latency_ns"] > 0).all()
    assert (k["launch_latency_ns"] < 10_000_000_000).all()  # time-bound: 10 s is a decoding error, not load


def test_torch_profiler_still_works_with_the_hand_over_wrapper(run_dir):
    """The wrapper that hands CUPTI to torch.profiler leaves torch.profiler working
    (on CPU here: the hand-over itself needs a GPU and is tested under -m gpu)."""
    import torch
    import torch.autograd.profiler as autograd_profiler

    from stepscope.integrations import torch as st_torch

    st_torch.instrumentor.ensure()
    st_torch.instrumentor.ensure()  # idempotent
    assert autograd_profiler.profile.__exit__.__wrapped__ is not None
    s = stepscope.start(name="prof-cpu", gpu="off")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.randn(64, 64) @ torch.randn(64, 64)
    s.stop()
    assert any("mm" in e.name for e in prof.events())
    assert not [n for n in stepscope.load(s.path).notes if "torch.profiler" in n]  # nothing was paused


def test_steps_window_hook_is_harmless_without_cupti(run_dir):
    """STEPSCOPE_STEPS installs a native step hook; with CUPTI not tracing it changes nothing."""
    s = stepscope.start(name="window", gpu="off")
    _native.cupti_set_steps(2, 3)
    for _ in range(6):
        stepscope.step()
    _native.cupti_stop()  # removes the hook
    stepscope.end_step()
    s.stop()
    assert not _native.cupti_status()["active"]
    assert len(stepscope.load(s.path).steps) == 6


@pytest.mark.gpu
@gpu_only
def test_steps_window_bounds_kernel_tracing(tmp_path):
    """STEPSCOPE_STEPS=3-5: kernels are traced in train steps 3..5 only."""
    _, run = _run_gpu_script(tmp_path, "train", "10", name="window", STEPSCOPE_STEPS="3-5")
    k = run.kernels
    # Integrations may mark a step late (at its true start, after the fact): the switch
    # happens at the mark, so a few kernels at the window's edges may fall either side.
    assert {3, 4, 5} <= set(k["step"]) <= {2, 3, 4, 5, 6}
    assert k["step"].isin([3, 4, 5]).mean() >= 0.9
    assert len(run.steps) == 10


def test_innermost_phase_wins():
    """Nested phases (Forward/Backward inside an LBFGS Optimizer step, Recompute inside
    Backward): a launch belongs to the innermost phase running."""
    import pandas as pd

    from stepscope.analysis.tables.gpu import attribute

    phases = pd.DataFrame({"process": "p", "name": ["Optimizer", "Forward", "Backward", "Recompute"],
                           "start_ns": [0, 10, 30, 35], "end_ns": [100, 20, 50, 40]})
    steps = pd.DataFrame({"process": ["p", "p"], "mode": ["train", "train"], "step": [0, 1],
                          "start_ns": [0, 100], "end_ns": [100, 200]})
    times = np.array([5, 15, 25, 37, 45, 60, 150, -1])
    mode, step, phase = attribute(np.array(["p"] * len(times)), times, steps, phases)
    assert list(phase) == ["Optimizer", "Forward", "Optimizer", "Recompute", "Backward", "Optimizer", None, None]
    assert list(step) == [0, 0, 0, 0, 0, 0, 1, -1]
    assert list(mode) == ["train"] * 7 + [None]
