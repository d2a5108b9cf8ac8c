"""GPU rules against runs written through the core: real sessions with real steps
and phases on the host, the GPU side simulated on the same clock.

``SimGPU`` is a CUDA stream: a kernel starts when its launch call reaches the GPU
or when the previous kernel ends, whichever is later; a synchronization really
blocks the host until the stream drains; a launch blocks while a few milliseconds
of work are queued (the launch queue is full), so a fast host is paced by its GPU.
NVML utilization samples are computed from the simulated kernels (the share of
each interval a kernel ran), and the host's /proc counters are written by the test
(the sampler reads an empty proc root).

Time is the simulation's own (``CLOCK``): the host loop's work (``spin``), its waits
(``idle``, a full launch queue, a sync) and every phase and step mark advance it by the
amount chosen, and nothing reads the machine's clock, so the runs are the same on an idle
machine and a busy one (issue 74). The session then waits for the machine's clock to pass
the simulated loop's end before it stops, so that every record lies inside it.
"""

import contextlib

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import stepscope
from stepscope.analysis.rules import evaluate
from stepscope.core import _native
from stepscope.core import gpu_records as rec
from stepscope.core import runinfo
from stepscope.core.vocabulary import CATEGORIES, PROCESS_JSON, RUN_JSON

GPU_RULES = {"LowGPUUtilization", "CPUBottleneck", "IOBottleneck", "BatchSize", "GPUMemoryIncrease",
             "KernelLaunchBound", "HostSyncStall"}
SYSTEM = CATEGORIES.index("system")
GiB = 1 << 30
SAMPLE_NS = 20_000_000  # 20 ms between synthetic samples


class Clock:
    """The simulation's time in ``time.monotonic_ns()`` nanoseconds (the clock GPU records are
    written in), and its native ticks from one anchor: every conversion is exact."""

    def start(self):
        # the anchor: a tick read between two clock reads, the closest pair of many (as the writer takes its own)
        best = None
        for _ in range(50):
            a, ticks, b = time.monotonic_ns(), _native.now(), time.monotonic_ns()
            if best is None or b - a < best[0]:
                best = (b - a, (a + b) // 2, ticks)
        _, self.mono0, self.ticks0 = best
        self.tpn = _native.clock_info()["ticks_per_ns"]
        self.ns = time.monotonic_ns()

    def ticks(self, t_ns):
        return self.ticks0 + int((t_ns - self.mono0) * self.tpn)


CLOCK = Clock()
PHASE = CATEGORIES.index("phase")


def spin(us):
    """Busy host work (Python between two operations) of ``us`` microseconds."""
    CLOCK.ns += int(us * 1000)


def idle(s):
    """The host waiting ``s`` seconds (a sleep: a parameter server, a slow peer, the disk)."""
    CLOCK.ns += int(s * 1e9)


# What a step mark or a `with` line costs the host (a few microseconds of Python): no launch
# falls on a phase's edge, where the writer's map from ticks to nanoseconds and the clock's
# (each exact to well under a microsecond) would decide which phase it belongs to.
MARK_NS = 2_000


@contextlib.contextmanager
def phase(name):
    """``stepscope.phase`` on the simulation's clock."""
    start = CLOCK.ns
    CLOCK.ns += MARK_NS
    try:
        yield
    finally:
        CLOCK.ns += MARK_NS
        _native.span(PHASE, _native.intern(name), CLOCK.ticks(start), CLOCK.ticks(CLOCK.ns))


class SimGPU:
    corr = 1000  # correlation ids are unique per process, across devices

    def __init__(self, device=0, queue_ms=20.0):
        self.device, self.queue_ns = device, int(queue_ms * 1e6)
        self.free_at = 0
        self.kernels = []

    @classmethod
    def _next(cls):
        cls.corr += 1
        return cls.corr

    def launch(self, name, us, latency_us=5):
        if self.free_at - CLOCK.ns > self.queue_ns:  # launch queue full: the host blocks
            CLOCK.ns = self.free_at - self.queue_ns
        t, c = CLOCK.ns, self._next()
        rec.api("cudaLaunchKernel", t, t + 3_000, c)
        CLOCK.ns += 3_000
        start = max(t + latency_us * 1000, self.free_at)
        self.free_at = start + int(us * 1000)
        self.kernels.append((name, start, self.free_at, c))

    def item(self):
        """loss.item(): a 4-byte device-to-host copy, then the host waits for the stream."""
        t, c = CLOCK.ns, self._next()
        rec.api("cudaMemcpyAsync", t, t + 4_000, c)
        start = max(t + 5_000, self.free_at)
        rec.memcpy("DtoH", 4, start, start + 2_000, c, device=self.device, src="device", dst="pageable")
        self.free_at = start + 2_000
        s, c = t + 4_000, self._next()
        end = max(s + 1_000, self.free_at + 1_000)  # the host returns once the stream drained
        CLOCK.ns = end
        rec.api("cudaStreamSynchronize", s, end, c)
        rec.sync("stream_synchronize", s, end, c, device=self.device, stream=7)

    def flush(self):
        for name, start, end, c in self.kernels:
            rec.kernel(name, start, end, c, device=self.device, grid=(108, 1, 1), block=(256, 1, 1))

    def util(self, t0, t1):
        """Percent of [t0, t1) a kernel ran (NVML's definition)."""
        if not self.kernels:
            return 0.0
        k = np.array([(s, e) for _, s, e, _ in self.kernels], dtype=np.int64)
        return 100.0 * float(np.clip(np.minimum(k[:, 1], t1) - np.maximum(k[:, 0], t0), 0, None).sum()) / (t1 - t0)


class Host:
    """Writes the sampler's raw counters (cumulative jiffies, bytes) for a synthetic host."""

    def __init__(self, cores=8):
        self.cores = cores
        self.acc = {}

    def _ticks(self, t_ns):
        return CLOCK.ticks(t_ns)

    def _add(self, name, amount, at):
        self.acc[name] = self.acc.get(name, 0.0) + amount
        _native.counter(SYSTEM, _native.intern(name), float(self.acc[name]), None, at)

    def sample(self, t_ns, dt_s, cores_busy, iowait=0.0, process=50.0, disk_mb_s=0.0):
        """cores_busy: each core's busy % (a list) or one value for all; iowait: % of every core;
        process: the training process's CPU in % of one core."""
        at = self._ticks(t_ns)
        busy = cores_busy if isinstance(cores_busy, list) else [cores_busy] * self.cores
        jiffies = dt_s * 100
        for dev, b in [("all", sum(busy) / self.cores)] + [(f"cpu{i}", b) for i, b in enumerate(busy)]:
            scale = self.cores if dev == "all" else 1
            wait = min(iowait, 100 - b)
            self._add(f"cpu.busy|{dev}", b / 100 * jiffies * scale, at)
            self._add(f"cpu.iowait|{dev}", wait / 100 * jiffies * scale, at)
            self._add(f"cpu.idle|{dev}", (100 - b - wait) / 100 * jiffies * scale, at)
        self._add("proc.utime|", process / 100 * jiffies, at)
        self._add("proc.stime|", 0.0, at)
        self._add("disk.read_bytes|nvme0n1", disk_mb_s * (1 << 20) * dt_s, at)
        self._add("disk.reads|nvme0n1", disk_mb_s * 8 * dt_s, at)
        self._add("disk.write_bytes|nvme0n1", 0.0, at)
        self._add("disk.writes|nvme0n1", 0.0, at)

    def gpu(self, t_ns, device, util, used, total=80 * GiB):
        at = self._ticks(t_ns)
        for metric, v in (("util", util), ("mem_used", used), ("mem_total", total)):
            _native.counter(SYSTEM, _native.intern(f"gpu.{metric}|gpu{device}"), float(v), None, at)


def record(tmp_path, name, steps, body, host_at, gpus, memory_at=lambda t, frac: 30 * GiB, nvml=True, trace=True,
           framework="torch"):
    """Runs `steps` real steps (body(i, gpus) inside each), then writes the GPU records
    (trace), NVML samples (util from the simulation, memory from memory_at) and host
    counters (host_at(step) -> Host.sample keywords, for the step running at each sample).
    The run is a simulated `framework` job: its metadata lists that framework's version
    only (not what this test process happens to have imported)."""
    os.environ["STEPSCOPE_DIR"] = str(tmp_path / "runs")
    empty = tmp_path / "proc"
    empty.mkdir(exist_ok=True)
    os.environ["STEPSCOPE_PROC_ROOT"] = str(empty)  # no real /proc samples: the test writes them
    try:
        session = stepscope.start(name=name, gpu="off", interval_ms=60000)
    finally:
        os.environ.pop("STEPSCOPE_PROC_ROOT")
    CLOCK.start()
    marks = []
    for i in range(steps):
        marks.append(CLOCK.ns)
        _native.begin_step("train", CLOCK.ticks(CLOCK.ns))
        CLOCK.ns += MARK_NS
        body(i, gpus)
    marks.append(CLOCK.ns)
    _native.end_step(CLOCK.ticks(CLOCK.ns))
    while time.monotonic_ns() < marks[-1] + 6 * SAMPLE_NS:  # the session ends after the simulated loop
        time.sleep(0.01)
    host = Host()
    t = marks[0] - 5 * SAMPLE_NS
    while t <= marks[-1] + 5 * SAMPLE_NS:
        step = int(np.clip(np.searchsorted(marks, t, side="right") - 1, 0, steps - 1))
        host.sample(t, SAMPLE_NS / 1e9, **host_at(step))
        frac = (t - marks[0]) / (marks[-1] - marks[0])
        for g in gpus if nvml else ():
            host.gpu(t, g.device, g.util(t - SAMPLE_NS, t), memory_at(t, frac))
        t += SAMPLE_NS
    for g in gpus if trace else ():
        g.flush()
    session.stop()
    as_job_of(session.path, framework)
    return stepscope.load(session.path), session.path


def as_job_of(path, framework):
    """Makes a run's metadata say its processes imported `framework` (None: no framework) and nothing else."""
    versions = {"python": "3", **({framework: "1.0"} if framework else {})}
    files = [os.path.join(path, RUN_JSON)] + [os.path.join(path, d, PROCESS_JSON) for d in os.listdir(path)
                                               if os.path.isfile(os.path.join(path, d, PROCESS_JSON))]
    for f in files:
        runinfo.write_json_atomic(f, {**runinfo.read_json(f), "versions": versions})


# These simulations compress a loop into a second or two: GPUMemoryIncrease judges their
# steady state from a shorter window than a real run's (its min_window_s: 5 s).
SIM_PARAMS = {"StepOutlier": {"min_excess_s": 1.0}, "GPUMemoryIncrease": {"min_window_s": 0.0}}


def judge(run, overrides=None):
    """All rules, StepOutlier made blind to this shared machine's scheduler hiccups; the
    result as `stepscope summary --json` would write it. (Without the floor on a finding's
    total over the run: these simulated runs are 30 steps of a few ms, shorter than any
    real GPU job; tests/test_rules.py holds that floor.)"""
    from unittest import mock

    from stepscope.analysis.rules import base

    params = {rule: dict(p) for rule, p in SIM_PARAMS.items()}
    for rule, p in (overrides or {}).items():
        params.setdefault(rule, {}).update(p)
    with mock.patch.object(base, "MIN_TOTAL_S", 0.0):
        result = evaluate(run, params)
    return json.loads(json.dumps(result))


def fired(result):
    return sorted({f["rule"] for f in result["findings"]})


def only(result, rule):
    assert fired(result) == [rule], result["findings"]
    (f,) = result["findings"]
    return f


# --- host loops -------------------------------------------------------------------
def well_fed(i, gpus):
    """Big kernels; the host queues them ahead and is paced by the full launch queue."""
    (g, *more) = gpus
    with phase("GetNext"):
        spin(200)
    with phase("Forward"):
        for _ in range(3):
            g.launch("ampere_sgemm_128x64_tn", 1500)
            for m in more:
                m.launch("ampere_sgemm_128x64_tn", 900)
    with phase("Loss"):
        g.launch("nll_loss_forward_reduce_cuda_kernel_2d", 300)
    with phase("Backward"):
        for _ in range(4):
            g.launch("ampere_sgemm_128x64_nt", 1500)
            for m in more:
                m.launch("ampere_sgemm_128x64_nt", 900)
    with phase("Optimizer"):
        g.launch("multi_tensor_apply_kernel", 500)
    spin(300)


QUIET_HOST = dict(cores_busy=30.0, process=60.0)


def test_well_fed_gpu_triggers_no_rule(tmp_path):
    # memory: the caching allocator reserves its pools in the first steps, then stays flat
    run, _ = record(tmp_path, "fed", 40, well_fed, lambda s: QUIET_HOST, [SimGPU()],
                    memory_at=lambda t, frac: (20 if frac < 0.05 else 50) * GiB + (t // SAMPLE_NS % 3) * (1 << 20))
    result = judge(run)
    assert result["findings"] == []
    assert not GPU_RULES & set(result["not_applicable"]), result["not_applicable"]
    k = run.kernels
    assert len(k) == 40 * 9 and set(k["phase"]) == {"Forward", "Loss", "Backward", "Optimizer"}
    util = run.system[run.system["metric"] == "gpu_util"]["value"]
    assert util.median() > 90  # the simulated GPU really was kept busy


def test_cpu_only_run_lists_gpu_rules_as_not_applicable(tmp_path):
    os.environ["STEPSCOPE_DIR"] = str(tmp_path / "runs")
    session = stepscope.start(name="cpu", gpu="off", interval_ms=20)
    for _ in range(20):
        stepscope.step()
        with stepscope.phase("Forward"):
            time.sleep(0.002)
    stepscope.end_step()
    session.stop()
    result = evaluate(stepscope.load(session.path))
    assert result["findings"] == []
    reasons = result["not_applicable"]
    assert GPU_RULES | {"LoadBalancing"} <= set(reasons), reasons
    assert "NVML" in reasons["LowGPUUtilization"] and "CUPTI" in reasons["KernelLaunchBound"]


def cpu_bound_second_half(i, gpus):
    if i < 20:
        return well_fed(i, gpus)
    (g,) = gpus
    with phase("Forward"):
        spin(8000)  # tokenizing / building inputs in Python inside the model
        g.launch("ampere_sgemm_128x64_tn", 600)
    with phase("Backward"):
        g.launch("ampere_sgemm_128x64_nt", 600)


def test_cpu_bottleneck_names_the_windows_and_steps(tmp_path):
    # every core busy from step 20 on: 50 ms windows tell the parts apart
    run, _ = record(tmp_path, "cpu", 48, cpu_bound_second_half,
                    lambda s: QUIET_HOST if s < 20 else dict(cores_busy=97.0, process=100.0), [SimGPU()])
    f = only(judge(run, {"CPUBottleneck": {"window_s": 0.05}}), "CPUBottleneck")
    ev = f["evidence"]
    assert ev["gpu"] == "gpu0" and f["rank"] is None
    assert 0.3 <= ev["share_of_loop"] <= 0.8
    firsts = [w["steps"][0] for w in ev["low_windows"]]
    assert min(firsts) >= 19 and max(w["steps"][1] for w in ev["low_windows"]) == 47
    assert all(w["cpu_util"] >= 90 and w["gpu_util"] < 50 for w in ev["low_windows"])
    assert ev["means"]["cpu_util"] > 90 and "all CPU cores" in f["message"]
    assert ev["framework"] == "torch" and "torchvision" in f["recommendation"]


def rejudged(path, framework, rule, overrides=None):
    """The same run's finding of `rule` had its processes imported `framework` instead."""
    as_job_of(path, framework)
    return only(judge(stepscope.load(path, cache=False), overrides), rule)


def starved(i, gpus):
    """Few kernels per step, the host mostly waiting (sleep): GPU low, host idle."""
    (g,) = gpus
    with phase("GetNext"):
        spin(300)
    with phase("Forward"):
        for _ in range(2):
            g.launch("ampere_sgemm_128x64_tn", 700)
    with phase("Backward"):
        for _ in range(3):
            g.launch("ampere_sgemm_128x64_nt", 700)
    idle(0.008)  # e.g. waiting for a parameter server, or for a slow peer


ONE_BUSY_CORE = dict(cores_busy=[100.0] + [8.0] * 7, process=25.0)  # a neighbour's process pins one core


def test_small_batch_with_one_busy_core_is_batch_size_not_cpu(tmp_path):
    run, _ = record(tmp_path, "batch", 30, starved, lambda s: ONE_BUSY_CORE, [SimGPU()],
                    memory_at=lambda t, frac: 12 * GiB)
    f = only(judge(run), "BatchSize")
    ev = f["evidence"]
    assert ev["share_of_loop"] == 1.0 and ev["means"]["gpu_memory_percent"] == pytest.approx(15, abs=0.1)
    assert ev["means"]["gpu_util"] < 50 and ev["means"]["cpu_util"] < 25
    (w,) = ev["low_windows"]  # a loop shorter than window_s is one window
    assert w["busy_cores"] == "1/8" and w["busiest_core"] == 100 and w["steps"] == [2, 29]


def test_low_gpu_utilization_when_memory_is_full(tmp_path):
    run, _ = record(tmp_path, "low", 30, starved, lambda s: ONE_BUSY_CORE, [SimGPU()],
                    memory_at=lambda t, frac: 70 * GiB)
    f = only(judge(run), "LowGPUUtilization")
    assert f["evidence"]["means"]["gpu_util"] < 50 and f["evidence"]["means"]["gpu_memory_percent"] > 80


def io_bound(i, gpus):
    """Each step writes and reads back a state file while the GPU idles (no fsync: a slow disk
    on this shared machine would make steps outliers; the iowait itself is synthetic)."""
    (g,) = gpus
    with phase("GetNext"):
        spin(200)
    with phase("Forward"):
        g.launch("ampere_sgemm_128x64_tn", 800)
    with phase("Backward"):
        g.launch("ampere_sgemm_128x64_nt", 800)
    with open(io_bound.path, "wb") as f:
        f.write(os.urandom(1 << 16))
    with open(io_bound.path, "rb") as f:
        assert len(f.read()) == 1 << 16
    idle(0.006)


def test_io_bottleneck(tmp_path):
    io_bound.path = str(tmp_path / "state.bin")
    run, path = record(tmp_path, "io", 30, io_bound, lambda s: dict(cores_busy=12.0, iowait=35.0, process=15.0,
                                                                 disk_mb_s=180.0), [SimGPU()])
    f = only(judge(run), "IOBottleneck")
    m = f["evidence"]["means"]
    assert m["cpu_iowait"] == pytest.approx(35, abs=0.5) and m["disk_read_bytes_per_s"] > 150 * (1 << 20)
    assert "I/O wait" in f["message"]
    # the advice speaks the run's framework
    assert "DataLoader num_workers" in f["recommendation"] and f["evidence"]["framework"] == "torch"
    tf = rejudged(path, "tensorflow", "IOBottleneck")
    assert tf["evidence"]["framework"] == "tensorflow" and tf["message"] == f["message"]
    assert "num_parallel_calls=tf.data.AUTOTUNE" in tf["recommendation"] and "cache()" in tf["recommendation"]
    assert "DataLoader" not in tf["recommendation"] and "num_workers" not in tf["recommendation"]
    plain = rejudged(path, None, "IOBottleneck")
    assert plain["evidence"]["framework"] == "generic"
    assert not any(w in plain["recommendation"] for w in ("DataLoader", "num_workers", "tf.data"))


def test_gpu_memory_increase(tmp_path):
    run, _ = record(tmp_path, "gpumem", 40, well_fed, lambda s: QUIET_HOST, [SimGPU()],
                    memory_at=lambda t, frac: int((10 + 20 * frac) * GiB) + (t // SAMPLE_NS % 5) * (50 << 20))
    f = only(judge(run), "GPUMemoryIncrease")
    ev = f["evidence"]
    assert ev["gpu"] == "gpu0" and 15 * 1024 <= ev["growth_mb"] <= 21 * 1024 and ev["trend"] > 0.9
    assert ev["steps"] == [2, 39]


def launch_bound(i, gpus):
    """Many 4 us kernels, 30 us of Python between launches: the GPU mostly waits."""
    (g,) = gpus
    with phase("GetNext"):
        spin(200)
    with phase("Forward"):
        for _ in range(40):
            g.launch("vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>", 4)
            spin(30)
    with phase("Backward"):
        for _ in range(60):
            g.launch("vectorized_elementwise_kernel<4, at::native::MulFunctor<float>>", 4)
            spin(30)
    with phase("Optimizer"):
        g.launch("multi_tensor_apply_kernel", 20)


def test_kernel_launch_bound(tmp_path):
    # NVML samples would rightly add CPUBottleneck (the training process saturates its core); this
    # run has the trace only, to see KernelLaunchBound alone
    run, path = record(tmp_path, "launch", 30, launch_bound, lambda s: QUIET_HOST, [SimGPU()], nvml=False)
    f = only(judge(run), "KernelLaunchBound")
    ev = f["evidence"]
    assert ev["kernels_per_step"] == 101 and ev["busy_ratio"] < 0.2 and ev["kernel_us_median"] == 4
    assert ev["launch_gap_share"] > 0.6 and ev["step_range"] == [2, 29]
    assert next(iter(ev["launch_gap_ms_per_step_by_phase"])) == "Backward"
    assert "CUDA graph" in f["recommendation"]
    # the command line picks the rule up from the registry
    out = subprocess.run([sys.executable, "-m", "stepscope", "summary", path, "--json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)  # (with the floor on a finding's total: this 30-step run is under it)
    assert "KernelLaunchBound" in {x["rule"] for x in summary["findings"] + summary["below_cost_floor"]}


def syncs_every_step(i, gpus):
    (g,) = gpus
    with phase("GetNext"):
        spin(200)
    with phase("Forward"):
        for _ in range(3):
            g.launch("ampere_sgemm_128x64_tn", 1500)
    with phase("Loss"):
        g.launch("nll_loss_forward_reduce_cuda_kernel_2d", 300)
        g.item()  # print(loss.item())
        spin(1500)  # ...and logs it before backward is launched: the GPU idles that long (the cost)
    with phase("Backward"):
        for _ in range(4):
            g.launch("ampere_sgemm_128x64_nt", 1500)
    with phase("Optimizer"):
        g.launch("multi_tensor_apply_kernel", 500)


def test_host_sync_stall_names_the_phase_and_call(tmp_path):
    run, path = record(tmp_path, "sync", 30, syncs_every_step, lambda s: QUIET_HOST, [SimGPU()])
    f = only(judge(run), "HostSyncStall")
    ev = f["evidence"]
    assert ev["phase"] == "Loss" and ev["launch_api"] == "cudaStreamSynchronize"
    assert ev["steps_with_sync"] == ev["steps"] == 28 and ev["syncs_per_step"] == 1
    assert ev["sync_share"] > 0.2 and ev["dtoh_copies_in_phase_per_step"] == 1
    assert ".item()" in f["recommendation"] and "non_blocking" in f["recommendation"]
    tf = rejudged(path, "tensorflow", "HostSyncStall")
    assert ".numpy()" in tf["recommendation"] and "prefetch" in tf["recommendation"]
    assert not any(w in tf["recommendation"] for w in (".item()", "non_blocking", "torch"))


def test_load_balancing_names_the_busy_and_the_idle_gpu(tmp_path):
    # one process, two GPUs: gpu1 gets 60% of gpu0's work
    run, _ = record(tmp_path, "gpus", 40, well_fed, lambda s: QUIET_HOST, [SimGPU(0), SimGPU(1)])
    f = only(judge(run), "LoadBalancing")
    ev = f["evidence"]
    assert ev["busiest_gpu"] == "gpu0" and ev["idlest_gpu"] == "gpu1" and ev["source"] == "kernels"
    assert ev["busy_percent"]["gpu0"] > 90 and 45 < ev["busy_percent"]["gpu1"] < 70
    # without the trace, NVML utilization tells the same
    run, _ = record(tmp_path, "gpus-nvml", 30, well_fed, lambda s: QUIET_HOST, [SimGPU(0), SimGPU(1)], trace=False)
    f = only(judge(run), "LoadBalancing")
    assert f["evidence"]["source"] == "nvml" and f["evidence"]["idlest_gpu"] == "gpu1"
