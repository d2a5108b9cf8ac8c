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
    from stepscope.analysis.store import dataset_build

    path, trace = _write_run(tmp_path, "corrupt")
    size = os.path.getsize(trace)
    with open(trace, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    if in_parts:
        monkeypatch.setattr(dataset_build, "PART_BYTES", max(size // 5, 1024))
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


# --- a run that did not close (issue 47, item 8) ------------------------------------------

HARD_EXIT_JOB = textwrap.dedent("""
    import os, sys, time, torch
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps, pause, how = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    for i in range(steps):
        x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        time.sleep(pause)
    print("LOOP DONE", flush=True)
    if how == "exit":
        os._exit(0)
    if how == "kill":
        os.kill(os.getpid(), 9)
    if how == "hang":
        time.sleep(60)
""")


def _job(tmp_path, name, steps, pause, how, flush_ms=1000, wait=True):
    (tmp_path / "job.py").write_text(HARD_EXIT_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE="1", STEPSCOPE_DIR="runs", STEPSCOPE_RUN=name, STEPSCOPE_FLUSH_MS=str(flush_ms),
               STEPSCOPE_PYSAMPLE_HZ="0")
    p = subprocess.Popen([sys.executable, "job.py", str(steps), str(pause), how], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, text=True)
    if wait:
        p.communicate(timeout=120)
    return p, tmp_path / "runs" / name


def _summary(path):
    from stepscope.analysis.report.summary import summarize

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return summarize(str(path))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_run_that_ended_without_closing_says_so_everywhere(tmp_path, how):
    """os._exit and SIGKILL after 12 steps (the last ones inside the last flush interval):
    the summary, its JSON, the report and diff say the run did not close and what is lost."""
    from stepscope.analysis.report.diff import diff, format_diff
    from stepscope.analysis.report.page import write_report
    from stepscope.analysis.report.summary import format_text

    _, clean_path = _job(tmp_path, "clean", 12, 0.1, "end")
    _, path = _job(tmp_path, "hard", 12, 0.1, how)
    clean, hard = _summary(clean_path), _summary(path)
    assert clean["complete"] is True and clean["ending"]["state"] == "closed"
    assert clean["steps"]["train"]["count"] == 12
    assert not any("without closing" in w for w in clean["warnings"])
    # the last flush interval is lost, as documented (how many steps it held depends on timing)
    assert 0 < hard["steps"]["train"]["count"] <= 12
    assert hard["complete"] is False and hard["ending"]["state"] == "not_closed"
    assert hard["ending"]["flush_interval_ms"] == 1000
    (proc,) = hard["ending"]["processes"]
    assert proc["state"] == "not_closed" and isinstance(proc["pid"], int)
    text = format_text(hard)
    assert "(ended without closing)" in text.splitlines()[0]
    assert "warning: the run ended without closing" in text and "1000 ms, STEPSCOPE_FLUSH_MS" in text
    assert "without closing" not in format_text(clean)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        html = open(write_report(stepscope.load(path), str(tmp_path / "r.html"))).read()
    assert 'id="run-ending"' in html and "The run ended without closing" in html

    d = diff(str(clean_path), str(path))
    assert d["complete"] == {"a": True, "b": False}
    assert list(d["ending_warnings"]) == ["b"]
    assert "warning: run B (hard): the run ended without closing" in format_diff(d)


def test_a_run_that_lost_its_whole_loop_does_not_claim_what_it_imported(tmp_path):
    """The whole loop inside the first flush interval, then os._exit: nothing written. The
    note says the process ended without closing, and does not say which frameworks it
    imported (stepscope records them when a process closes) nor that its loop never began."""
    _, path = _job(tmp_path, "lost", 12, 0.0, "exit", flush_ms=60000)
    s = _summary(path)
    assert "train" not in s["steps"] and s["complete"] is False
    (note,) = s["loop_notes"]
    assert note["key"] == "nothing_recorded"
    assert "ended without closing" in note["message"] and "within its first flush interval" in note["message"]
    assert "60000 ms" in note["message"]
    assert "imported none" not in note["message"] and "before its loop began" not in note["message"]
    assert "is not known" in note["message"]
    assert note["evidence"]["frameworks"] is None and note["evidence"]["state"] == "not_closed"


def test_a_run_being_written_is_still_running_then_not_closed(tmp_path):
    """A live process's run is "still running", not "ended without closing"; once it is
    killed, it is."""
    p, path = _job(tmp_path, "live", 6, 0.05, "hang", flush_ms=100, wait=False)
    try:
        assert p.stdout.readline().strip() == "LOOP DONE"
        time.sleep(0.5)  # past a flush
        s = _summary(path)
        assert s["complete"] is False and s["ending"]["state"] == "running"
        assert s["warnings"][0].startswith("the run is still running")
        assert s["steps"]["train"]["count"] == 6
    finally:
        p.kill()
        p.wait()
    s = _summary(path)
    assert s["ending"]["state"] == "not_closed"


def test_a_reused_pid_is_not_the_process_that_wrote_the_run():
    """pid and start time together name a process: this process's pid with another start
    time is a process that has ended."""
    from stepscope.analysis.ending import process_alive
    from stepscope.core import runinfo

    me, started, host = os.getpid(), runinfo.process_start_time(), runinfo.hostname()
    assert process_alive(me, host, started) is True
    assert process_alive(me, host, started - 3600) is False
    assert process_alive(me, "another-host", started) is None
    assert process_alive(2**22 + 12345, host, started) is False  # above any pid_max: no such process
