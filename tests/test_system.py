"""System metrics from the native sampler: measured against known loads."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import stepscope
from stepscope.compat.smdebug import PandasFrame
from stepscope.core.vocabulary import PROCESS_JSON

from conftest import run_python

MiB = 1 << 20


def _window(system, metric, device, t0, t1):
    s = system[(system["metric"] == metric) & (system["device"] == device)]
    # a sample's rate covers the interval that ends at its timestamp
    return s[(s["timestamp_ns"] > t0 + 150_000_000) & (s["timestamp_ns"] <= t1)]["value"].to_numpy()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores to pin to")
def test_busy_core_reads_busy_and_the_others_read_what_the_kernel_counts(tmp_path):
    """A loop pinned to one core: that core reads at least the share of the window the loop
    ran there (its own thread's CPU time: the whole window on an idle machine); every core
    reads what /proc/stat counted over the same window (idle when nothing else runs, busy
    when other tests share the machine, throttled where a container's CPU quota is spent);
    the process reads what it consumed. The controls are measured in the same process, so
    the test holds beside any load."""
    r = run_python("""
        import json, os, time, stepscope
        def jiffies():  # cpuN -> (busy, total), as the kernel counts them
            out = {}
            with open("/proc/stat") as f:
                for line in f:
                    name, *v = line.split()
                    if name.startswith("cpu") and name != "cpu":
                        v = list(map(int, v[:8]))
                        out[name] = (sum(v) - v[3] - v[4], sum(v))
            return out
        run = stepscope.start(dir="runs", name="busy", interval_ms=50)
        cores = sorted(os.sched_getaffinity(0))
        busy = cores[-1]
        time.sleep(0.5)
        os.sched_setaffinity(0, {busy})
        t0 = time.time_ns()
        k0, c0, p0 = jiffies(), time.thread_time(), time.process_time()
        x = 0
        while time.time_ns() - t0 < 2_000_000_000:
            x += 1
        k1, c1, p1 = jiffies(), time.thread_time(), time.process_time()
        t1 = time.time_ns()
        os.sched_setaffinity(0, set(cores))
        time.sleep(0.3)
        run.stop()
        kernel = {c: 100 * (k1[c][0] - k0[c][0]) / max(1, k1[c][1] - k0[c][1]) for c in k0}
        wall = (t1 - t0) / 1e9
        print("WINDOW", busy, t0, t1, 100 * (c1 - c0) / wall, 100 * (p1 - p0) / wall, json.dumps(kernel))
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    busy, t0, t1, loop, process, kernel = r.stdout.split("WINDOW")[1].strip().split(" ", 5)
    busy, t0, t1, kernel = int(busy), int(t0), int(t1), json.loads(kernel)
    loop, process = float(loop), float(process)
    system = stepscope.load(tmp_path / "runs" / "busy").system
    on_busy = _window(system, "cpu_util", f"cpu{busy}", t0, t1)
    assert len(on_busy) >= 20
    # the pinned loop's own time on its core is a floor for that core's reading
    assert np.mean(on_busy) >= loop - 15, (on_busy, loop)
    cores = [d for d in system["device"].unique() if str(d).startswith("cpu")]
    assert f"cpu{busy}" in cores and len(cores) >= 2 and set(cores) <= set(kernel)
    for d in cores:
        assert abs(np.mean(_window(system, "cpu_util", d, t0, t1)) - kernel[d]) < 15, (d, kernel[d])
    own = _window(system, "proc_cpu_percent", "self", t0, t1)
    assert abs(np.mean(own) - process) < 15, (own, process)  # the process itself: what it consumed


def _filesystem_of(path):
    """The type of the filesystem holding ``path`` (the longest mount point above it)."""
    path, best, kind = os.path.realpath(path), "", ""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mount, fstype = fields[4], fields[fields.index("-") + 1]
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, kind = mount, fstype
    return kind


def test_disk_and_process_io_account_for_200_mb(tmp_path):
    if _filesystem_of(tmp_path) in ("tmpfs", "ramfs"):  # pages in memory: no block I/O to count
        pytest.skip(f"{tmp_path} is on a memory filesystem: writing there does no disk I/O")
    r = run_python("""
        import os, time, stepscope
        run = stepscope.start(dir="runs", name="io", interval_ms=50)
        time.sleep(1.2)  # disks are read once a second: one reading before the writes begin
        block = os.urandom(1 << 20)
        t0 = time.time_ns()
        with open("big.bin", "wb") as f:
            for _ in range(200):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        fd = os.open("big.bin", os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the read-back must hit the disk
        while os.read(fd, 1 << 20):
            pass
        os.close(fd)
        t1 = time.time_ns()
        time.sleep(0.3)
        run.stop()
        os.remove("big.bin")
        print("WINDOW", t0, t1)
    """, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    t0, t1 = map(int, r.stdout.split("WINDOW")[1].split())
    run = stepscope.load(tmp_path / "runs" / "io")
    system = run.system

    def total_bytes(metric, device=None):
        s = system[system["metric"] == metric]
        if device:
            s = s[s["device"] == device]
        total = 0.0
        for _, g in s.groupby("device") if device is None else [(device, s)]:
            g = g.sort_values("timestamp_ns")
            ts, rate = g["timestamp_ns"].to_numpy(), g["value"].to_numpy(dtype=float)
            # each sample is the rate since the one before: times its own interval (a late
            # sample on a busy machine covers more than the 50 ms asked for)
            dt = np.diff(ts, prepend=ts[0]) / 1e9 if len(ts) else ts
            inside = ts > t0  # to the run's end: disks are read once a second, the last time at stop
            total += float((rate[inside] * dt[inside]).sum())
        return total

    want = 200 * MiB
    for metric in ("proc_write_bytes_per_s", "proc_read_bytes_per_s"):
        got = total_bytes(metric, "self")
        assert abs(got - want) <= 0.1 * want, (metric, got / MiB)
    for metric in ("disk_write_bytes_per_s", "disk_read_bytes_per_s"):
        got = total_bytes(metric)
        assert want * 0.9 <= got <= want * 1.5, (metric, got / MiB)  # the disk also serves others


def test_rss_follows_a_500_mb_allocation(tmp_path):
    r = run_python("""
        import time, stepscope
        run = stepscope.start(dir="runs", name="rss", interval_ms=50)
        time.sleep(0.3)
        t0 = time.time_ns()
        block = bytearray(500 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(0.5)
        t1 = time.time_ns()
        del block
        time.sleep(0.5)
        run.stop()
        print("WINDOW", t0, t1)
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    t0, t1 = map(int, r.stdout.split("WINDOW")[1].split())
    s = stepscope.load(tmp_path / "runs" / "rss").system
    rss = s[(s["metric"] == "proc_rss") & (s["device"] == "self")]
    before = rss[rss["timestamp_ns"] < t0]["value"].max()
    during = rss[(rss["timestamp_ns"] > t1 - 300_000_000) & (rss["timestamp_ns"] <= t1)]["value"].min()
    after = rss[rss["timestamp_ns"] > t1 + 300_000_000]["value"].min()
    assert 480 * MiB <= during - before <= 560 * MiB
    assert after - before < 100 * MiB


def test_missing_proc_files_are_notes_and_the_rest_is_kept(tmp_path):
    fake = tmp_path / "proc"
    (fake / "self").mkdir(parents=True)
    (fake / "stat").write_text("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 100 0 100 800 0 0 0 0 0 0\nctxt 5\n")
    (fake / "meminfo").write_text("MemTotal:       1000 kB\nMemAvailable:    250 kB\n")
    (fake / "self" / "stat").write_text("1 (python x) R 0 1 1 0 -1 0 0 0 0 0 7 3 0 0 20 0 4 0 1 1 100 0\n")
    r = run_python("""
        import time, stepscope
        run = stepscope.start(dir="runs", name="fake", interval_ms=20)
        time.sleep(0.3)
        run.stop()
    """, cwd=tmp_path, env={"STEPSCOPE_PROC_ROOT": str(fake)})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    run = stepscope.load(tmp_path / "runs" / "fake")
    notes = " ".join(run.notes)
    for missing in ("loadavg", "diskstats", "net/dev", "self/io"):
        assert missing in notes, notes
    assert "/stat " not in notes
    s = run.system
    mem = s[s["metric"] == "mem_used_percent"]["value"]
    assert len(mem) >= 2 and (mem == 75.0).all()  # read once a second, and at stop
    assert (s[(s["metric"] == "proc_rss")]["value"] == 100 * os.sysconf("SC_PAGESIZE")).all()
    assert (s[(s["metric"] == "proc_threads")]["value"] == 4).all()


def test_summary_has_the_system_block(tmp_path):
    r = run_python("""
        import time, stepscope
        with stepscope.profile(dir="runs", name="sum", interval_ms=20):
            t = time.time()
            while time.time() - t < 0.5:
                pass
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([sys.executable, "-m", "stepscope", "summary", "runs/sum", "--json"], cwd=tmp_path,
                         capture_output=True, text=True)
    system = json.loads(out.stdout)["system"]
    assert 0 < system["cpu_util_mean"] <= 100
    assert system["memory_used_max_bytes"] > 0
    for key in ("cpu_util", "cpu_iowait", "net_rx_bytes_per_s", "disk_write_bytes_per_s"):
        assert set(system[key]) == {"mean", "p50", "p95", "max"}


@pytest.mark.slow
def test_debugger_notebook_cells_run_on_a_pytorch_run(tmp_path):
    pytest.importorskip("torch")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "loops.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp_path / "runs"), STEPSCOPE_RUN="dbg")
    r = subprocess.run([sys.executable, script, "loader", "10"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # The cells of a Debugger analysis notebook, unchanged:
    pf = PandasFrame(str(tmp_path / "runs" / "dbg"))
    system_metrics_df = pf.get_all_system_metrics()
    framework_metrics_df = pf.get_all_framework_metrics()
    assert list(system_metrics_df.columns) == ["timestamp", "timestamp_us", "value", "system_metric", "dimension",
                                               "nodeID", "type"]
    cpu = system_metrics_df[system_metrics_df["system_metric"].str.match("cpu")]
    assert set(cpu["dimension"]) == {"CPUUtilization", "I/OWaitPercentage"}
    assert ((cpu["value"] >= 0) & (cpu["value"] <= 100)).all()
    assert "MemoryUsedPercent" in set(system_metrics_df["system_metric"])
    steps = framework_metrics_df[framework_metrics_df["framework_metric"] == "Step:ModeKeys.TRAIN"]
    durations = steps["end_time_us"] - steps["start_time_us"]
    assert len(steps) == 20 and (durations > 0).all()
    assert len(framework_metrics_df[framework_metrics_df["framework_metric"] == "Step:ModeKeys.EVAL"]) == 20
    # samples and steps share one time base
    assert system_metrics_df["timestamp_us"].min() < steps["start_time_us"].min()
    assert system_metrics_df["timestamp_us"].max() >= steps["end_time_us"].max() - 200_000


@pytest.mark.slow
def test_two_ranks_on_one_host_share_one_node_sampler(tmp_path):
    pytest.importorskip("torch")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "ddp.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    r = subprocess.run([sys.executable, "-m", "stepscope", "run", "--dir", "runs", "--name", "ddp2",
                        "--interval-ms", "20", "--", sys.executable, "-m", "torch.distributed.run",
                        "--nproc_per_node", "2", "--standalone", script],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    run = stepscope.load(tmp_path / "runs" / "ddp2")
    system = run.system
    node_rows = system[system["metric"] == "cpu_util"]
    assert node_rows["process"].nunique() == 1, "one process samples the host"
    proc_rows = system[system["metric"] == "proc_rss"]
    ranks = run.processes.dropna(subset=["rank"])
    assert set(ranks["process"]) <= set(proc_rows["process"]), "each rank samples itself"
    # both ranks' steps fall inside the host's sampled span
    steps = run.steps
    t = node_rows["timestamp_ns"]
    for rank, s in steps.groupby("rank"):
        assert t.min() <= s["start_ns"].min() and s["end_ns"].max() <= t.max() + 50_000_000
        inside = ((t >= s["start_ns"].min()) & (t <= s["end_ns"].max())).sum()
        assert inside >= 1
    metas = [json.load(open(os.path.join(run.path, p, PROCESS_JSON))) for p in ranks["process"]]
    assert len({m["node_sampler"] for m in metas}) == 1


def test_cpu_every_interval_and_the_slow_files_once_a_second(tmp_path):
    """CPU and the process's CPU time and RSS at every tick; memory, load, disks, network and
    I/O bytes once a second, on a CPU reading's timestamp, and once more at stop."""
    r = run_python("""
        import time, stepscope
        run = stepscope.start(dir="runs", name="cadence", interval_ms=50)
        time.sleep(2.3)
        run.stop()
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    events = stepscope.load(tmp_path / "runs" / "cadence").events
    system = events[(events["category"] == "system") & (events["kind"] == "counter")]

    def times(name):
        return np.sort(system[system["name"].astype(str) == name]["start_ns"].to_numpy())

    cpu, rss = times("cpu.busy|all"), times("proc.rss|")
    slow = {name: times(name) for name in ("mem.available|", "load1|", "proc.rchar|")}
    assert 25 <= len(cpu) <= 50 and abs(len(rss) - len(cpu)) <= 1, (len(cpu), len(rss))
    for name, t in slow.items():
        assert 3 <= len(t) <= 4, (name, len(t))  # at 0, 1 (and 2) s, and at stop
        ticked = t[t <= cpu[-1]]
        assert len(ticked) >= 2 and np.isin(ticked, cpu).all(), name  # on a CPU reading's timestamp
        assert np.all(np.diff(ticked) > 0.9e9), (name, np.diff(t))  # a second apart
        assert t[-1] >= cpu[-1], name  # at stop, unless the last tick read them
