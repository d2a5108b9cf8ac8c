"""Killed writers and damaged files: keep what is readable, say what is not."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import stepscope
from stepscope.analysis import RunFormatError
from stepscope.core.vocabulary import TRACE_FILE


def test_sigkill_keeps_everything_up_to_one_flush(tmp_path):
    code = textwrap.dedent("""
        import sys, time, stepscope
        run = stepscope.start(dir="runs", name="killed", flush_interval_ms=200)
        print("STARTED", flush=True)
        i = 0
        while True:
            with stepscope.annotate("work"):
                time.sleep(0.001)
            i += 1
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                         env={k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")})
    assert p.stdout.readline().strip() == "STARTED"
    time.sleep(2.0)
    killed_at = time.time_ns()
    p.send_signal(signal.SIGKILL)
    p.wait()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        r = stepscope.load(tmp_path / "runs" / "killed")
    work = r.events[r.events["name"] == "work"]
    assert len(work) > 500
    last_end = int(work["end_ns"].max())
    # flush interval 200 ms, plus scheduling slack on a busy 2-core machine
    assert killed_at - last_end < 200_000_000 + 300_000_000, (killed_at - last_end) / 1e6
    assert not r.processes["clean_close"].iloc[0]


def _write_run(tmp_path, name, n=20_000):
    run = stepscope.start(dir=str(tmp_path / "runs"), name=name, flush_interval_ms=10)
    for i in range(n):
        with stepscope.annotate("a"):
            pass
        if i % 2000 == 0:
            time.sleep(0.03)  # several flushes: several chunks
    run.stop()
    (proc,) = [d for d in os.listdir(run.path) if os.path.isdir(os.path.join(run.path, d))]
    return run.path, os.path.join(run.path, proc, TRACE_FILE)


def test_truncated_file_loads_the_prefix_with_a_warning(tmp_path):
    path, trace = _write_run(tmp_path, "trunc")
    size = os.path.getsize(trace)
    with open(trace, "r+b") as f:
        f.truncate(size * 2 // 3)
    with pytest.warns(UserWarning, match=r"trace\.ssc: truncated chunk.*offset \d+") as caught:
        r = stepscope.load(path)
    assert caught[0].filename == __file__  # the warning points at the caller's line
    n = len(r.events[r.events["name"] == "a"])
    assert 5_000 < n < 20_000


@pytest.mark.parametrize("in_parts", [False, True])
def test_corrupt_chunk_is_skipped_and_named(tmp_path, monkeypatch, in_parts):
    """Read at once, or through a dataset built a part at a time (each part checks the
    checksums of the chunks it decodes): the damaged chunk is named once, the rest kept."""
    from stepscope.analysis import dataset

    path, trace = _write_run(tmp_path, "corrupt")
    size = os.path.getsize(trace)
    with open(trace, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    if in_parts:
        monkeypatch.setattr(dataset, "PART_BYTES", max(size // 5, 1024))
    with pytest.warns(UserWarning, match=r"trace\.ssc: (checksum mismatch|corrupt).*offset \d+") as caught:
        r = stepscope.load(path, dataset=in_parts)
    named = [w for w in caught if "checksum mismatch" in str(w.message) or "corrupt" in str(w.message)]
    assert len(named) == 1
    n = len(r.events[r.events["name"] == "a"])
    assert 10_000 < n < 20_000  # one chunk lost, the rest kept


def test_garbage_trace_is_a_clear_error_and_other_processes_still_load(tmp_path):
    path, trace = _write_run(tmp_path, "garbage")
    bad = os.path.join(path, "otherhost-pid1")
    os.mkdir(bad)
    with open(os.path.join(bad, TRACE_FILE), "wb") as f:
        f.write(b"this is not a trace")
    with pytest.warns(UserWarning, match=r"otherhost-pid1/trace\.ssc is not a stepscope trace"):
        r = stepscope.load(path)
    assert (r.events["name"] == "a").sum() == 20_000
    with pytest.raises(RunFormatError):
        stepscope.load(tmp_path / "does-not-exist")
