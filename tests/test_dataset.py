"""A run read through its partitioned Parquet dataset (analysis/store/) gives the
same tables, summary and findings as one decoded in memory, without building the
events table; the layout is the documented Hive one that DuckDB reads."""

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from test_torch import SCRIPTS, run_script

torch = pytest.importorskip("torch")

import stepscope  # noqa: E402
from stepscope.analysis.store import dataset_build, dataset_read  # noqa: E402
from stepscope.analysis.run import Run  # noqa: E402
from stepscope.analysis.store.schema import DATASET_TABLES, GPU_TABLES, RUN_TABLES  # noqa: E402
from stepscope.analysis.report.summary import summarize  # noqa: E402
from stepscope.core.vocabulary import CACHE_DIR, TRACE_FILE  # noqa: E402

TABLES = RUN_TABLES


@pytest.fixture(scope="module")
def worker_run(tmp_path_factory):
    """A torch run with two forked DataLoader workers: three process folders."""
    tmp = tmp_path_factory.mktemp("workers")
    run_script(tmp, os.path.join(SCRIPTS, "slow_worker.py"), "fork", name="fork")
    return tmp / "runs" / "fork"


@pytest.fixture
def gpu_run(run_dir):
    from test_gpu import _synthetic_training

    s = stepscope.start(name="gpu", gpu="off")
    _synthetic_training(steps=4, latency_ns=1_000_000)
    s.stop()
    return s.path


def _copy(src, tmp_path, name):
    dest = tmp_path / name
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(CACHE_DIR))
    return dest


class _EventsTrap(Run):
    """Fails when analysis builds the events or kernels table of a large run (the GPU
    rules read the kernels aggregated per step)."""

    @property
    def events(self):
        if self.large:
            raise AssertionError("the events table of a large run was built")
        return super().events

    @property
    def kernels(self):
        if self.large:
            raise AssertionError("the kernels table of a large run was built")
        return super().kernels


def _in_order(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows in an order of all their values: rows equal in the columns a table is sorted by
    (two events of one start) may come in either order from the two stores."""
    keys = [frame[c].astype(object).map(str).to_numpy(dtype=str) for c in reversed(frame.columns)]
    return frame.iloc[np.lexsort(keys)].reset_index(drop=True)


def _same(a: Run, b: Run):
    for table in TABLES:
        x, y = getattr(a, table), getattr(b, table)
        assert list(x.columns) == list(y.columns) and len(x) == len(y), table
        if not len(x):
            continue  # (the in-memory builders' empty frames differ among themselves in dtypes)
        assert dict(x.dtypes.astype(str)) == dict(y.dtypes.astype(str)), table
        pd.testing.assert_frame_equal(_in_order(x), _in_order(y), check_categorical=False, obj=table)
    sa, sb = summarize(a), summarize(b)
    assert json.dumps(sa, sort_keys=True, default=str) == json.dumps(sb, sort_keys=True, default=str)
    return sa


@pytest.mark.parametrize("source,parts", [("worker_run", False), ("worker_run", True), ("gpu_run", False)])
def test_the_dataset_gives_the_same_tables_and_findings(source, parts, request, tmp_path, monkeypatch):
    path = _copy(request.getfixturevalue(source), tmp_path, "run")
    if parts:  # each trace decoded in pieces of about 8 KB (a large trace's way), in files of 200 rows
        monkeypatch.setattr(dataset_build, "PART_BYTES", 8 << 10)
        monkeypatch.setattr(dataset_build, "ROW_GROUP", 200)
    memory = stepscope.load(path, cache=False)
    through = stepscope.load(path, dataset=True)
    if parts:
        events = os.path.join(through._store.root, "events")
        # in pieces: parts end at the trace's chunks, and a run this short has few (2 seen beside a busy core)
        assert max(len(os.listdir(os.path.join(events, d))) for d in os.listdir(events)) >= 2
    assert through._store.root is not None and memory._store.root is None
    summary = _same(memory, through)
    assert summary["steps"]["train"]["count"] > 0
    if source == "worker_run":
        assert len(through.samples) > 10 and len(through.ops) > 10  # the stack sampler and an op window
        assert len(memory.processes) == 3 and any(f["rule"] == "Dataloader" for f in
                                                   summary["findings"] + summary["related_findings"])
    else:
        assert len(through.kernels) == 13  # 4 steps x 3 phases, and an orphan kernel

    # Large: every table, the summary and every rule without the events table.
    monkeypatch.setattr(dataset_read, "LARGE_EVENTS", 0)
    large = _EventsTrap(path, dataset=True)
    assert large.large
    assert json.dumps(summarize(large), sort_keys=True, default=str) == json.dumps(summary, sort_keys=True,
                                                                                   default=str)
    assert not large._store.has("events")
    # SQL over a large run reads the dataset's files through DuckDB views
    n = large.sql("select count(*) as n from events where category = 'phase'")["n"].iloc[0]
    assert n == int((memory.events["category"] == "phase").sum()) and not large._store.has("events")


def test_gpu_records_decoded_in_parts(run_dir, tmp_path, monkeypatch):
    """A large trace's GPU records are decoded, attributed and aggregated a part at a time:
    the GPU tables are the same as decoded at once, a kernel whose launch is in the part
    before it still finds it, and the per-step aggregates add up to the same counts."""
    import threading
    import time

    from stepscope.core import gpu_records as rec

    monkeypatch.setenv("STEPSCOPE_FLUSH_MS", "10")  # every step's records in chunks of their own
    s = stepscope.start(name="gpuparts", gpu="off")
    corr, late = 0, None
    for step in range(8):
        stepscope.step()
        for phase in ("Forward", "Backward"):
            with stepscope.phase(phase):
                for _ in range(3):
                    corr += 1
                    t = time.monotonic_ns()
                    rec.api("cudaLaunchKernel", t, t + 2_000, corr, thread=threading.get_native_id())
                    if late is not None:  # the kernel of the step before, recorded a part later
                        rec.kernel("late_kernel", *late)
                        late = None
                    if corr % 7 == 0:
                        late = (t + 5_000, t + 9_000, corr)
                    else:
                        rec.kernel(f"kernel_{corr % 3}", t + 5_000, t + 9_000, corr, stream=7)
                time.sleep(0.015)
    stepscope.end_step()
    s.stop()
    monkeypatch.setattr(dataset_build, "PART_BYTES", 1024)
    memory = stepscope.load(s.path, cache=False)
    parts = stepscope.load(s.path, dataset=True)
    kernel_files = os.listdir(os.path.join(parts._store.root, "kernels", os.listdir(
        os.path.join(parts._store.root, "kernels"))[0]))
    # each part's tables in a file of their own, and nothing else left behind
    assert len(kernel_files) >= 3 and set(os.listdir(parts._store.root)) <= {*DATASET_TABLES, "manifest.json"}
    for table in GPU_TABLES:
        pd.testing.assert_frame_equal(getattr(memory, table), getattr(parts, table), check_categorical=False,
                                      obj=table)
    k = parts.kernels
    late = k[k["name"] == "late_kernel"]
    assert len(late) >= 2 and late["launch_api"].eq("cudaLaunchKernel").all() and (late["step"] >= 0).all()
    a, b = memory.kernel_steps, parts.kernel_steps
    assert len(a) == len(b) and a["kernels"].sum() == b["kernels"].sum() == len(k)
    assert (a["kernels"].to_numpy() == b["kernels"].to_numpy()).all()
    assert (a["kernel_ns"].to_numpy() == b["kernel_ns"].to_numpy()).all()
    # busy time differs at most by what a part's first kernel overlaps of the kernels before it
    assert abs(int(a["busy_ns"].sum()) - int(b["busy_ns"].sum())) <= 4_000 * len(kernel_files)
    assert parts.kernel_names["kernels"].sum() == len(k)
    # the aggregates are tables SQL reads, from memory and from the dataset alike
    query = "select sum(kernels) as n from kernel_steps where step >= 0"
    assert memory.sql(query)["n"].iloc[0] == parts.sql(query)["n"].iloc[0] == int((k["step"] >= 0).sum())


def test_a_live_run_decodes_only_what_is_new(run_dir, monkeypatch):
    """Issue 13: a run still being written is read through a dataset built afresh on each
    load, but the finished parts of its traces are kept: the next load decodes only the
    parts written since, and every table is the same as decoded at once."""
    import time

    from stepscope.analysis.store import reader
    from stepscope.analysis.store.dataset_store import LIVE_DIR

    monkeypatch.setenv("STEPSCOPE_FLUSH_MS", "10")
    monkeypatch.setattr(dataset_build, "PART_BYTES", 2048)
    decoded = []
    real = reader.read_process
    monkeypatch.setattr(reader, "read_process", lambda *a, **k: decoded.append(a[1:]) or real(*a, **k))

    def work(steps):
        for _ in range(steps):
            stepscope.step()
            for phase in ("Forward", "Backward", "Optimizer"):
                with stepscope.phase(phase):
                    time.sleep(0.002)
        stepscope.end_step()  # (an open step ends with the trace's last event, which moves)

    s = stepscope.start(name="live", gpu="off")
    work(60)
    time.sleep(0.1)  # flushed
    first = stepscope.load(s.path, dataset=True)
    parts_first = len(decoded)
    live = os.path.join(s.path, CACHE_DIR, LIVE_DIR)
    assert parts_first >= 3 and os.path.isdir(live)
    assert len(first.steps) >= 55
    work(20)
    time.sleep(0.1)
    decoded.clear()
    second = stepscope.load(s.path, dataset=True)
    parts_now = max(int(p[0]) for p in decoded) + 1
    # only the parts that were not finished at the first load are decoded again
    assert len(decoded) <= parts_now - parts_first + 2 < parts_now
    assert len(second.steps) > len(first.steps)
    fresh = stepscope.load(s.path, cache=False)  # everything decoded at once, in memory
    for table in ("steps", "phases"):
        pd.testing.assert_frame_equal(second.__getattribute__(table).reset_index(drop=True),
                                      fresh.__getattribute__(table).reset_index(drop=True),
                                      check_categorical=False, obj=table)
    s.stop()
    done = stepscope.load(s.path, dataset=True)
    assert not os.path.exists(live) and done._store.root.startswith(os.path.join(s.path, CACHE_DIR, "dataset-"))
    assert len(done.steps) == len(stepscope.load(s.path, cache=False).steps)


def test_layout_is_hive_partitioned_and_cached(worker_run, tmp_path):
    import duckdb

    path = _copy(worker_run, tmp_path, "run")
    run = stepscope.load(path, dataset=True)
    root = run._store.root
    assert os.path.dirname(root) == str(path / CACHE_DIR)
    processes = sorted(run.processes["process"])
    assert sorted(os.listdir(os.path.join(root, "events"))) == [f"process={p}" for p in processes]
    con = duckdb.connect()
    glob = os.path.join(root, "steps", "*", "*.parquet")
    got = con.execute(f"select process, count(*) from read_parquet('{glob}', hive_partitioning = true) "
                      f"group by process").fetchall()
    assert dict(got) == run.steps.groupby("process", observed=True).size().to_dict()

    # The next load reads the cached dataset (no decoding); a changed trace makes a new one.
    manifest = os.path.join(root, "manifest.json")
    mtime = os.stat(manifest).st_mtime_ns
    again = stepscope.load(path, dataset=True)
    assert again._store.root == root and os.stat(manifest).st_mtime_ns == mtime
    assert len(again.steps) == len(run.steps)
    trace = path / processes[0] / TRACE_FILE
    os.utime(trace, ns=(mtime + 10**9, mtime + 10**9))
    third = stepscope.load(path, dataset=True)
    assert third._store.root != root and not os.path.exists(root)


def test_parallel_build_and_a_read_only_run(worker_run, tmp_path, monkeypatch):
    path = _copy(worker_run, tmp_path, "run")
    monkeypatch.setattr(dataset_build, "PARALLEL_BYTES", 0)  # one spawned worker per process folder
    parallel = stepscope.load(path, dataset=True)
    memory = stepscope.load(path, cache=False)
    _same(memory, parallel)
    # No cache (as for a run folder that cannot be written): a private dataset, removed with the Run.
    private = stepscope.load(path, dataset=True, cache=False)
    root = private._store.root
    assert not root.startswith(str(path)) and len(private.steps) == len(memory.steps)
    del private
    assert not os.path.exists(root)


def test_a_damaged_trace_keeps_what_is_readable(worker_run, tmp_path):
    path = _copy(worker_run, tmp_path, "run")
    main = stepscope.load(path, cache=False).processes
    main = main[main["origin"] == "main"]["process"].iloc[0]
    trace = path / main / TRACE_FILE
    size = os.path.getsize(trace)
    with open(trace, "r+b") as f:
        f.truncate(size * 2 // 3)
    with pytest.warns(UserWarning, match=TRACE_FILE):
        memory = stepscope.load(path, cache=False)
    with pytest.warns(UserWarning, match=TRACE_FILE):
        through = stepscope.load(path, dataset=True)
    assert 0 < len(through.events) == len(memory.events) and len(through.steps) == len(memory.steps)
    assert through.warnings == memory.warnings


def test_the_report_of_a_large_gpu_run_holds_no_kernels(gpu_run, tmp_path, monkeypatch):
    """Issue 13: the GPU section of a large run's report comes from the kernels aggregated
    per step, and its timeline's GPU rows read only the chosen steps' operations."""
    from stepscope.analysis.report import timeline
    from stepscope.analysis.gpu_activity import device_operations
    from stepscope.analysis.report.page import render

    path = _copy(gpu_run, tmp_path, "run")
    memory = stepscope.load(path, cache=False)
    monkeypatch.setattr(dataset_read, "LARGE_EVENTS", 0)
    large = _EventsTrap(path, dataset=True)
    page = render(large)
    assert "GPU 0 computing" in page and "13 kernels" in page
    assert not any(large._store.has(t) for t in ("events", "kernels", "cuda_api"))
    data = timeline.timeline_data(large)
    windows = timeline._detail_windows(large.steps, data["meta"]["detail_steps"])
    assert 0 < len(windows) < len(large.steps)
    got = device_operations(large, during=windows)
    k = memory.kernels
    inside = np.zeros(len(k), dtype=bool)
    for t0, t1 in windows:
        inside |= (k["start_ns"] < t1).to_numpy() & (k["end_ns"] > t0).to_numpy()
    assert 0 < inside.sum() < len(k)
    assert sorted(got.loc[got["kind"] == "kernel", "start_ns"]) == sorted(k.loc[inside, "start_ns"])
    # the Parquet export of a large run is its dataset's files, not tables built in memory
    import duckdb

    from stepscope.analysis.run import export_parquet

    out = export_parquet(large, str(tmp_path / "pq"))
    glob = os.path.join(out, "kernels", "*", "*.parquet")
    n = duckdb.connect().execute(f"select count(*) from read_parquet('{glob}', hive_partitioning = true)") \
        .fetchone()[0]
    assert n == len(k) and os.path.isfile(os.path.join(out, "ops.parquet"))
    assert not any(large._store.has(t) for t in ("events", "kernels", "cuda_api"))


def test_export_of_a_window_of_steps(gpu_run, tmp_path, monkeypatch):
    """`stepscope export --steps A-B`: the trace holds what ran during those train steps
    (their spans, steps, kernels), read from a large run without its events or kernels."""
    import glob

    from stepscope.analysis.export.formats import export, step_windows

    path = _copy(gpu_run, tmp_path, "run")
    memory = stepscope.load(path, cache=False)
    monkeypatch.setattr(dataset_read, "LARGE_EVENTS", 0)
    large = _EventsTrap(path, dataset=True)
    windows = step_windows(large, [(1, 2)])
    chrome = export(large, "chrome", str(tmp_path / "chrome"), steps=[(1, 2)])
    perfetto = export(large, "perfetto", str(tmp_path / "w.perfetto-trace"), steps=[(1, 2)])
    assert not any(large._store.has(t) for t in ("events", "kernels", "cuda_api")) and os.path.getsize(perfetto) > 0
    trace = json.load(open(glob.glob(os.path.join(chrome, "*.json"))[0]))["traceEvents"]
    names = [e.get("name") for e in trace]
    assert {"ProfilerStep#1", "ProfilerStep#2"} <= set(names) and "ProfilerStep#3" not in names
    k = memory.kernels
    inside = np.zeros(len(k), dtype=bool)
    for t0, t1 in windows:
        inside |= (k["start_ns"] < t1).to_numpy() & (k["end_ns"] > t0).to_numpy()
    assert 0 < inside.sum() < len(k)
    assert sum(e.get("cat") == "kernel" for e in trace) == int(inside.sum())
    whole = json.load(open(glob.glob(os.path.join(export(memory, "chrome", str(tmp_path / "all")), "*.json"))[0]))
    assert sum(e.get("cat") == "kernel" for e in whole["traceEvents"]) == len(k)
    with pytest.raises(ValueError, match="no train step"):
        export(large, "chrome", str(tmp_path / "none"), steps=[(50, 60)])


def test_the_report_of_a_large_run_reads_only_its_chosen_steps(worker_run, tmp_path, monkeypatch):
    """Issue 13: the report of a large run never builds its events table. Its timeline keeps every
    span of the steps chosen for meaning (read with a time filter pushed into the scan), the
    same spans as from memory, and only the phases elsewhere."""
    from stepscope.analysis.report import timeline
    from stepscope.analysis.report.page import render

    path = _copy(worker_run, tmp_path, "run")
    memory = stepscope.load(path, cache=False)
    monkeypatch.setattr(dataset_read, "LARGE_EVENTS", 0)
    large = _EventsTrap(path, dataset=True)
    assert large.large
    page = render(large)
    assert "This run is large" in page and "Operators" in page and not large._store.has("events")
    a, b = timeline.timeline_data(memory), timeline.timeline_data(large)
    assert a["meta"]["detail_steps"] == b["meta"]["detail_steps"] and b["meta"]["phases_only_outside_detail"]
    chosen = b["meta"]["detail_steps"]
    reduced = timeline._large_run_events(large, timeline._detail_windows(large.steps, chosen))
    keys = {(c["mode"], c["step"]) for c in chosen}
    steps = memory.steps
    mine = [(m, s) in keys for m, s in zip(steps["mode"], steps["step"])]
    windows = timeline._merged(steps["start_ns"].to_numpy()[mine], steps["end_ns"].to_numpy()[mine])
    ev = memory.events
    ev = ev[ev["kind"] == "span"]
    near = pd.Series(False, index=ev.index)
    for t0, t1 in windows:
        near |= (ev["start_ns"] < t1) & (ev["end_ns"] > t0)

    def spans(frame):
        return sorted(zip(frame["process"].astype(str), frame["tid"], frame["name"].astype(str),
                          frame["start_ns"], frame["end_ns"]))

    def far(frame):  # overlapping none of the chosen steps
        return np.array([not any(a < t1 and b > t0 for t0, t1 in windows)
                         for a, b in zip(frame["start_ns"], frame["end_ns"])], dtype=bool)

    detail = reduced[~far(reduced)]
    assert len(ev[near]) > 20 and (ev[near]["category"] == "op").any()  # an op window is among the chosen steps
    assert spans(detail) == spans(ev[near])
    # elsewhere: the phases only, every one of them
    assert (reduced[far(reduced)]["category"] == "phase").all()
    assert len(reduced) - len(detail) == far(memory.phases).sum() > 0
