"""stepscope leaves the job its disk and its memory: a floor of free space the
trace never takes, and bounded name and Python-stack tables whatever a program
names or runs (issue 41, items 1 and 2)."""

import json
import os
import subprocess
import sys

import pytest

import stepscope
from stepscope.core import _native

from conftest import run_python

MiB = 1 << 20


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of a given size, mounted under tmp_path (root only), unmounted after."""
    mounted = []

    def make(size_kb):
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(where)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small file system here: {r.stderr.strip()}")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


# A real torch job that records a stream of annotations, then saves its checkpoint
# into the same file system as the run (a common layout: ./checkpoints beside ./stepscope-runs).
CHECKPOINT_JOB = """
    import os, sys, time, torch, stepscope
    torch.manual_seed(0)
    model = torch.nn.Linear({features}, {features})
    t_end = time.monotonic() + {seconds}
    i = 0
    while time.monotonic() < t_end:
        with stepscope.annotate("work"):
            i += 1
    torch.save(model.state_dict(), os.path.join({folder!r}, "checkpoint.pt"))
    print("saved", os.path.getsize(os.path.join({folder!r}, "checkpoint.pt")))
"""


def _checkpoint_job(folder, features=220, seconds=1.5):
    return CHECKPOINT_JOB.format(folder=str(folder), features=features, seconds=seconds)


@pytest.mark.slow
def test_a_file_system_under_the_floor_gets_no_trace_and_the_checkpoint_fits(tmp_path, small_fs):
    fs = small_fs(600)
    job = _checkpoint_job(fs)  # a ~190 kB checkpoint
    plain = run_python(job, cwd=tmp_path)
    assert plain.returncode == 0 and plain.stdout.startswith("saved"), plain.stderr
    os.unlink(fs / "checkpoint.pt")

    r = run_python(job, cwd=tmp_path, env={"STEPSCOPE": "1", "STEPSCOPE_DIR": str(fs / "runs"),
                                           "STEPSCOPE_RUN": "tiny", "STEPSCOPE_FLUSH_MS": "20"})
    assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "STEPSCOPE_DISK_FLOOR_MB" in lines[0], r.stderr
    assert "profiling is turned off" in lines[0]
    traces = [os.path.join(d, f) for d, _, fs_ in os.walk(fs / "runs") for f in fs_ if f == "trace.ssc"]
    assert traces == []  # no empty trace left behind


@pytest.mark.slow
def test_the_trace_stops_at_the_floor_mid_run_and_the_checkpoint_fits(tmp_path, small_fs):
    """A 3 MiB file system with a 50% floor: the trace grows to about 1.5 MiB, stops
    with one line, and the job's ~0.9 MB checkpoint written after it fits."""
    fs = small_fs(3 * 1024)
    job = _checkpoint_job(fs, features=480, seconds=4)
    env = {"STEPSCOPE": "1", "STEPSCOPE_DIR": str(fs / "runs"), "STEPSCOPE_RUN": "mid",
           "STEPSCOPE_FLUSH_MS": "20", "STEPSCOPE_PYSAMPLE_HZ": "0", "STEPSCOPE_DISK_FLOOR_MB": "0"}

    # Without a floor the trace takes the whole file system and the checkpoint fails
    # (what this test guards against: it must be able to fail).
    r = run_python(job, cwd=tmp_path, env={**env, "STEPSCOPE_RUN": "nofloor", "STEPSCOPE_DISK_FLOOR_PCT": "0"})
    assert r.returncode != 0 and "saved" not in r.stdout, (r.stdout, r.stderr[-2000:])
    subprocess.run(["rm", "-rf", str(fs / "runs"), str(fs / "checkpoint.pt")], check=True)

    r = run_python(job, cwd=tmp_path, env={**env, "STEPSCOPE_DISK_FLOOR_PCT": "50"})
    assert r.returncode == 0 and r.stdout.startswith("saved"), r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "stopped writing" in lines[0] and "STEPSCOPE_DISK_FLOOR_PCT" in lines[0], r.stderr
    trace, = (fs / "runs" / "mid").glob("*/trace.ssc")
    st = os.statvfs(fs)
    assert trace.stat().st_size > 0.5 * MiB  # it recorded until the floor, not less
    assert st.f_bavail * st.f_frsize > 0  # the checkpoint fitted and space is left
    run = stepscope.load(fs / "runs" / "mid", quiet=True)
    assert (run.events["name"] == "work").sum() > 10_000  # what was written before the floor is read


def test_a_bad_floor_setting_is_one_line_naming_it(tmp_path):
    r = run_python("import stepscope; print('ok')", cwd=tmp_path,
                   env={"STEPSCOPE": "1", "STEPSCOPE_DIR": str(tmp_path / "runs"), "STEPSCOPE_DISK_FLOOR_PCT": "80"})
    assert r.returncode == 0 and r.stdout == "ok\n"
    assert r.stderr.count("\n") == 1 and "STEPSCOPE_DISK_FLOOR_PCT" in r.stderr and "0 to 50" in r.stderr


# --- names ---------------------------------------------------------------------------

NAME_FLOOD = """
    import json, os, stepscope
    from stepscope.core import _native

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def flood(tag, n):
        for i in range(n):
            with stepscope.annotate(f"item {{tag}} {{i}} " + "x" * 40):
                pass
            stepscope.counter(f"queue {{tag}} {{i}} " + "y" * 40, i)

    flood("warmup", 2000)  # the allocator's first pages
    base = rss()
    flood("idle", {n})
    idle = rss() - base
    stepscope.start(flush_interval_ms=50)
    base = rss()
    flood("recording", {n})
    recording = rss() - base
    stepscope.stop()
    print(json.dumps({{"idle": idle, "recording": recording, "folded": _native.stats()["names_folded"]}}))
"""


def test_distinct_names_hold_no_memory_while_idle_and_a_bounded_table_while_recording(tmp_path):
    n = 150_000  # 300,000 distinct names in each phase (spans and counters): ~75 MB unbounded
    r = run_python(NAME_FLOOD.format(n=n), cwd=tmp_path, env={"STEPSCOPE_DIR": str(tmp_path / "runs"),
                                                              "STEPSCOPE_RUN": "names", "STEPSCOPE_PYSAMPLE_HZ": "0"},
                   timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["idle"] < 4 * MiB, out
    assert out["recording"] < 48 * MiB, out  # the table's bound plus the writer's buffers
    assert out["folded"] >= 2 * n - _native.MAX_NAMES, out

    run = stepscope.load(tmp_path / "runs" / "names", quiet=True)
    names = set(run.events["name"].astype(str))
    assert _native.OVERFLOW_NAME in names
    assert len(names) <= _native.MAX_NAMES
    folded = int((run.events["name"].astype(str) == _native.OVERFLOW_NAME).sum())
    assert folded == out["folded"] == run.names_folded  # every folded event is in the trace, and counted
    cli = subprocess.run([sys.executable, "-m", "stepscope", "summary", "--json", str(tmp_path / "runs" / "names")],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-2000:]
    s = json.loads(cli.stdout)
    assert s["names_folded"] == folded
    assert any("(other names)" in w for w in s["warnings"])


def test_names_interned_only_when_they_record(tmp_path):
    """An annotate() made while idle records under its own name once a session runs."""
    r = run_python("""
        import stepscope
        span = stepscope.annotate("made before the session")
        with span:
            pass  # not recorded: nothing records
        stepscope.start(flush_interval_ms=50)
        with span:
            pass
        stepscope.counter("loss", 1.5)
        stepscope.stop()
        try:
            stepscope.counter(3, 1.0)
        except TypeError as exc:
            print("TypeError", exc)
    """, cwd=tmp_path, env={"STEPSCOPE_DIR": str(tmp_path / "runs"), "STEPSCOPE_RUN": "late"})
    assert r.returncode == 0 and r.stdout.startswith("TypeError"), r.stderr
    ev = stepscope.load(tmp_path / "runs" / "late", quiet=True).events
    assert (ev["name"] == "made before the session").sum() == 1
    assert (ev["name"] == "loss").sum() == 1


# --- the Python sampler's tables ---------------------------------------------------------

GENERATED_CODE = """
    import sys, threading, time, stepscope
    from stepscope.core import _native
    sys.setswitchinterval(0.0005)  # let the sampler's GIL requests through often
    deadline = time.monotonic() + 120
    done = threading.Event()

    def worker(k):
        n = 0
        while not done.is_set():
            # a chain of freshly compiled functions: every sample sees new code objects
            src = "\\n".join(f"def f{{j}}():\\n    return {{'f%d()' % (j + 1) if j < 7 else 'sum(range(2000))'}}"
                             for j in range(8))
            ns = {{}}
            exec(compile(src, f"<generated {{k}} {{n}}>", "exec"), ns)
            for _ in range(3):
                ns["f0"]()
            n += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads: t.start()
    # until the sampler has seen more code objects than it keeps (each has a frame) and its
    # frame table stopped growing: new code is folded
    last = -1
    while time.monotonic() < deadline:
        frames = _native.pysampler_status()["frames"]
        if frames >= {codes} and frames == last:
            break
        last = frames
        time.sleep(0.5)
    done.set()
    for t in threads: t.join()
    print("done")
"""


def test_generated_code_folds_into_one_frame_past_the_sampler_bound(tmp_path):
    r = run_python(GENERATED_CODE.format(codes=1 << 14), cwd=tmp_path, timeout=300,
                   env={"STEPSCOPE": "1", "STEPSCOPE_DIR": str(tmp_path / "runs"), "STEPSCOPE_RUN": "gen",
                        "STEPSCOPE_PYSAMPLE_HZ": "1000"})
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr[-3000:]
    folder = [d for d in (tmp_path / "runs" / "gen").iterdir() if d.is_dir()][0]
    py = _native.read_trace(str(folder / "trace.ssc"))["py"]
    strings = list(py["strings"])
    files = [strings[i] for i in py["frame_file"]]
    funcs = [strings[i] for i in py["frame_func"]]
    generated = sum(1 for f in files if f.startswith("<generated"))
    assert generated >= (1 << 14) - 200, generated  # the code table filled with generated code ...
    assert len(files) <= 1 << 16  # ... the frame table stayed bounded ...
    other = [f for f in funcs if f.startswith("(other code")]
    assert len(other) == 1  # ... and newer code is one frame
    leaves = py["stack_frame"][py["stack"]]
    assert (leaves == funcs.index(other[0])).any()  # samples stand on it
