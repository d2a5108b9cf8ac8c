"""The analysis layer: SQL agrees with the DataFrames, the Parquet cache, live runs, diff, docs."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import stepscope
from stepscope.analysis.rules import rules_markdown
from stepscope.core.vocabulary import CACHE_DIR, TRACE_FILE

from conftest import REPO, run_python


def _small_run(tmp_path, name="sql"):
    r = run_python(f"""
        import time, stepscope
        with stepscope.profile(dir="runs", name="{name}", interval_ms=20):
            for i in range(30):
                stepscope.step()
                with stepscope.phase("GetNext"):
                    time.sleep(0.001)
                with stepscope.phase("Forward"):
                    time.sleep(0.002)
            stepscope.end_step()
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return tmp_path / "runs" / name


def test_sql_agrees_with_the_dataframes(tmp_path):
    run = stepscope.load(_small_run(tmp_path))
    steps = run.sql("select mode, count(*) as n, sum(duration_ns) as total, sum(Forward) as fwd "
                    "from steps group by mode")
    assert steps["n"].tolist() == [30]
    assert int(steps["total"].iloc[0]) == int(run.steps["duration_ns"].sum())
    assert int(steps["fwd"].iloc[0]) == int(run.steps["Forward"].sum())
    ev = run.sql("select name, count(*) as n from events where category = 'phase' group by name order by name")
    assert dict(zip(ev["name"], ev["n"])) == {"Forward": 30, "GetNext": 30}
    sysrows = run.sql("select count(*) as n from system where metric = 'cpu_util'")
    assert int(sysrows["n"].iloc[0]) == int((run.system["metric"] == "cpu_util").sum()) > 0
    ph = run.sql("select step, exclusive_ns from phases where name = 'Forward' order by step")
    assert ph["step"].tolist() == list(range(30))


def test_parquet_cache_is_used_and_invalidated(tmp_path):
    path = _small_run(tmp_path, "cache")
    first = stepscope.load(path).events
    cache = path / CACHE_DIR / "events.parquet"
    for t in threading.enumerate():  # the cache is written in the background
        if t.name == "stepscope-parquet-cache":
            t.join()
    assert cache.exists()
    mtime = cache.stat().st_mtime_ns
    again = stepscope.load(path).events
    assert cache.stat().st_mtime_ns == mtime  # read, not rewritten
    assert again.equals(first) or (again.astype(str).equals(first.astype(str)))
    # a changed trace invalidates the cache
    proc = next(p for p in os.listdir(path) if (path / p / TRACE_FILE).exists())
    with open(path / proc / TRACE_FILE, "ab") as f:
        f.write(b"\0" * 3)  # a torn tail, as from a crash: still loads, with a warning
    with pytest.warns(UserWarning, match="truncated"):
        reloaded = stepscope.load(path).events
    assert len(reloaded) == len(first)
    for t in threading.enumerate():
        if t.name == "stepscope-parquet-cache":
            t.join()
    manifest = json.loads((path / CACHE_DIR / "manifest.json").read_text())
    assert manifest["traces"][proc][0] == (path / proc / TRACE_FILE).stat().st_size


def test_a_run_loads_while_it_is_being_written(tmp_path):
    script = tmp_path / "live.py"
    script.write_text(
        "import sys, time, stepscope\n"
        "stepscope.start(dir='runs', name='live', flush_interval_ms=100)\n"
        "print('go', flush=True)\n"
        "for i in range(100000):\n"
        "    stepscope.step()\n"
        "    with stepscope.phase('Forward'):\n"
        "        time.sleep(0.002)\n")
    p = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                         env={k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")})
    try:
        assert p.stdout.readline().strip() == "go"
        time.sleep(1.5)
        first = stepscope.load(tmp_path / "runs" / "live", quiet=True).steps
        time.sleep(1.0)
        second = stepscope.load(tmp_path / "runs" / "live", quiet=True).steps
    finally:
        p.kill()
        p.wait()
    assert len(first) > 50 and len(second) > len(first)


@pytest.mark.slow
def test_diff_after_raising_num_workers(tmp_path):
    pytest.importorskip("torch")
    jobs = os.path.join(REPO, "tests", "scripts", "rule_jobs.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env["STEPSCOPE_DIR"] = str(tmp_path / "runs")
    for kind in ("slowdata", "slowdata8"):
        r = subprocess.run([sys.executable, "-m", "stepscope", "run", "--name", kind, "--", sys.executable, jobs,
                            kind], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    d = subprocess.run([sys.executable, "-m", "stepscope", "diff", "slowdata", "slowdata8", "--json"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert d.returncode == 0, d.stderr
    diff = json.loads(d.stdout)
    share = next(r for r in diff["rows"] if r["metric"] == "GetNext share")
    median = next(r for r in diff["rows"] if r["metric"] == "train step time (median)")
    # input-bound, then less so; the share keeps the 8 workers' start and shutdown (the first and
    # last steps' GetNext, ~0.3 s on this 2-core VM), which 40 steps do not amortize, so the
    # steady state is judged by the median step: it loses at least half the first run's wait
    # (its GetNext share of its step; what that is in ms depends on the CPU: measured, not fixed)
    assert share["a"] > 0.2 and share["b"] < share["a"]
    assert median["b"] < median["a"] * (1 - 0.5 * share["a"]), (median, share)
    # (a one-off StepOutlier in either run may come or go with the VM's load)
    assert "GetNextBottleneck" in diff["findings"]["cleared"]
    assert "GetNextBottleneck" not in diff["findings"].get("new", [])
    text = subprocess.run([sys.executable, "-m", "stepscope", "diff", "slowdata", "slowdata8"], cwd=tmp_path,
                          env=env, capture_output=True, text=True).stdout
    assert "cleared: GetNextBottleneck" in text


def test_rules_doc_is_current():
    with open(os.path.join(REPO, "docs", "rules.md")) as f:
        assert f.read().strip() == rules_markdown().strip(), "regenerate docs/rules.md (see its first line)"


def test_export_chrome_perfetto_parquet(tmp_path):
    import gzip

    path = _small_run(tmp_path, "exp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    outs = {}
    for fmt in ("chrome", "perfetto", "parquet"):
        r = subprocess.run([sys.executable, "-m", "stepscope", "export", str(path), "--format", fmt], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outs[fmt] = r.stdout.strip()
    assert os.listdir(outs["chrome"]) == ["rank0.pt.trace.json"]  # one file per rank; a plain script is rank 0
    trace = json.load(open(os.path.join(outs["chrome"], "rank0.pt.trace.json")))
    assert trace["distributedInfo"]["rank"] == 0
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X" and e["name"] in ("Forward", "GetNext")]
    assert {e["cat"] for e in spans} == {"user_annotation"} and len(spans) == 60
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    assert len(steps) == 30 and all(e["dur"] >= 3000 for e in steps)  # >= 3 ms each, in microseconds
    assert any(e["ph"] == "C" for e in events)
    assert outs["perfetto"].endswith("exp.perfetto-trace")  # protobuf, checked in test_perfetto.py
    gz = subprocess.run([sys.executable, "-m", "stepscope", "export", str(path), "--format", "perfetto", "-o",
                         "all.json.gz"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert gz.returncode == 0, gz.stderr
    assert json.load(gzip.open(tmp_path / "all.json.gz", "rt"))["traceEvents"] == events  # gzip JSON on request
    import duckdb

    run = stepscope.load(path, quiet=True)
    for table in ("events", "steps", "phases", "system"):
        file = os.path.join(outs["parquet"], f"{table}.parquet")
        rows = duckdb.connect().execute(f"select count(*) from '{file}'").fetchall()[0][0]
        assert rows == len(getattr(run, table)) > 0
    bad = subprocess.run([sys.executable, "-m", "stepscope", "export", str(path), "--format", "svg"], cwd=tmp_path,
                         env=env, capture_output=True, text=True)
    assert bad.returncode == 2


def test_report_is_self_contained_ordered_and_escaped(tmp_path):
    r = run_python("""
        import time, stepscope
        with stepscope.profile(dir="runs", name="rep", interval_ms=20):
            for i in range(20):
                stepscope.step()
                with stepscope.phase("GetNext"):
                    time.sleep(0.004)
                with stepscope.phase("Forward"):
                    time.sleep(0.001)
                with stepscope.annotate("<script>alert('x')</script>"):
                    pass
            stepscope.end_step()
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    out = subprocess.run([sys.executable, "-m", "stepscope", "report", "runs/rep", "-o", "r.html"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r.html").read_text()
    assert "<script>alert('x')</script>" not in page
    assert "src=\"http" not in page and "src='http" not in page  # nothing fetched: opens offline
    order = [page.index(f'id="{s}"') for s in ("verdict", "summary", "steps", "system", "timeline", "metadata")]
    assert order == sorted(order)
    assert "GetNextBottleneck" in page  # 80% of each step waits for data
