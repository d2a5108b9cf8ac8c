"""Forked and spawned children write their own process folders; parents are unaffected."""

import json
import os
import subprocess
import sys

import pytest

from conftest import run_python
from stepscope.core.vocabulary import PROCESS_JSON


def _procs(run_path):
    out = {}
    for d in sorted(os.listdir(run_path)):
        p = os.path.join(run_path, d)
        if os.path.isdir(p):
            with open(os.path.join(p, PROCESS_JSON)) as f:
                out[d] = json.load(f)
    return out


def test_os_fork_child_gets_its_own_folder(tmp_path):
    r = run_python("""
        import os, sys, stepscope
        run = stepscope.start(dir="runs", name="forked")
        with stepscope.annotate("before_fork"):
            pass
        pid = os.fork()
        if pid == 0:
            for _ in range(100):
                with stepscope.annotate("in_child"):
                    pass
            sys.exit(0)  # normal exit: atexit flushes the child's trace
        for _ in range(50):
            with stepscope.annotate("in_parent"):
                pass
        _, status = os.waitpid(pid, 0)
        run.stop()
        print("STATUS", status)
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "STATUS 0" in r.stdout
    import stepscope

    run = stepscope.load(tmp_path / "runs" / "forked")
    procs = _procs(run.path)
    assert len(procs) == 2
    origins = sorted(p["origin"] for p in procs.values())
    assert origins == ["fork", "main"]
    ev = run.events
    ev = ev[ev["category"] != "system"]
    by_proc = {p: set(ev[ev["process"] == p]["name"].astype(str)) for p in procs}
    parent = next(p for p, m in procs.items() if m["origin"] == "main")
    child = next(p for p, m in procs.items() if m["origin"] == "fork")
    assert by_proc[parent] == {"before_fork", "in_parent"}
    assert by_proc[child] == {"in_child"}
    assert (ev["name"] == "in_child").sum() == 100
    assert (ev["name"] == "in_parent").sum() == 50
    assert procs[child]["parent"] == parent


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_start_methods(tmp_path, method):
    (tmp_path / "worker.py").write_text(
        "import stepscope\n"
        "def work(i):\n"
        "    with stepscope.annotate('child_work'):\n"
        "        return i * i\n")
    r = run_python(f"""
        import multiprocessing as mp, sys
        sys.path.insert(0, ".")
        import stepscope, worker
        if __name__ == "__main__":
            run = stepscope.start(dir="runs", name="mp_{method}")
            with stepscope.annotate("parent_work"):
                pool = mp.get_context("{method}").Pool(2)
                print("RESULT", sum(pool.map(worker.work, range(20))))
                # close+join lets workers exit normally and flush; terminate() (what
                # `with Pool()` does) kills them and loses their last flush interval.
                pool.close()
                pool.join()
            run.stop()
    """, cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.stderr
    assert "RESULT 2470" in r.stdout
    assert "stepscope:" not in r.stderr, r.stderr
    import stepscope

    run = stepscope.load(tmp_path / "runs" / f"mp_{method}")
    ev = run.events
    assert (ev["name"] == "child_work").sum() == 20
    assert (ev["name"] == "parent_work").sum() == 1
    child_procs = set(ev[ev["name"] == "child_work"]["process"].astype(str))
    parent_proc = set(ev[ev["name"] == "parent_work"]["process"].astype(str))
    assert child_procs and not (child_procs & parent_proc)


def test_forked_children_that_os_exit_leave_no_process(tmp_path):
    """20 forked children leave through os._exit before their first flush: they are no
    processes of the run (summary, load, ls); a child whose events reached the disk is."""
    r = run_python("""
        import os, time, stepscope
        run = stepscope.start(dir="runs", name="exits")
        for i in range(20):
            pid = os.fork()
            if pid == 0:
                os._exit(0)  # before the writer's first flush (a second): nothing reaches the disk
            os.waitpid(pid, 0)
        pid = os.fork()
        if pid == 0:
            with stepscope.annotate("kept"):
                pass
            time.sleep(1.5)  # past the flush interval: the writer has flushed its event
            os._exit(0)
        os.waitpid(pid, 0)
        for _ in range(3):
            stepscope.step()
        run.stop()
    """, cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    import stepscope
    from stepscope.analysis.report.summary import summarize

    path = tmp_path / "runs" / "exits"
    run = stepscope.load(path)
    assert sorted(run.processes["origin"]) == ["fork", "main"]
    assert run.warnings == []
    ev = run.events
    assert (ev["name"] == "kept").sum() == 1
    s = summarize(run)
    assert s["warnings"] == [] and not any("without closing" in str(n) for n in s["notes"])
    ls = subprocess.run([sys.executable, "-m", "stepscope", "ls", str(tmp_path / "runs")], capture_output=True,
                        text=True, check=True)
    assert " 2 proc " in ls.stdout, ls.stdout
