"""Many threads at once, and floods the writer cannot keep up with."""

import threading

import pytest

from conftest import run_python

import stepscope


def test_eight_threads_every_event_present_nesting_per_thread(run_dir):
    run = stepscope.start(name="threads")
    per_thread = 20_000
    barrier = threading.Barrier(8)
    tids = {}

    def work(i):
        tids[i] = threading.get_native_id()
        barrier.wait()
        outer, inner = f"t{i}.outer", f"t{i}.inner"
        for _ in range(per_thread // 2):
            with stepscope.annotate(outer):
                with stepscope.annotate(inner):
                    pass

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.stop()
    r = stepscope.load(run.path)
    assert r.dropped_events == 0
    ev = r.events
    for i in range(8):
        mine = ev[ev["tid"] == tids[i]]
        assert len(mine) == per_thread
        assert set(mine["name"].astype(str)) == {f"t{i}.outer", f"t{i}.inner"}
        names = mine["name"].astype(str).to_numpy()
        assert (names[0::2] == f"t{i}.outer").all() and (names[1::2] == f"t{i}.inner").all()
        o, n = mine.iloc[0::2], mine.iloc[1::2]
        assert (o["start_ns"].to_numpy() <= n["start_ns"].to_numpy()).all()
        assert (n["end_ns"].to_numpy() <= o["end_ns"].to_numpy()).all()


@pytest.mark.slow
def test_flood_memory_is_bounded_and_drops_are_counted(tmp_path):
    """20 M events (~200 MB of trace) as fast as C++ can record them: memory stays
    bounded, nothing silent. (bench/core_api.py floods 50 M for BENCHMARKS.md.)"""
    r = run_python("""
        import resource, stepscope
        from stepscope.core import _native
        def status_mb(key):  # VmHWM: this process's peak (ru_maxrss survives exec)
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(key):
                        return int(line.split()[1]) / 1024
        from stepscope.core.vocabulary import TRACE_FILE
        run = stepscope.start(dir="runs", name="flood")
        before = status_mb("VmRSS")
        name = _native.intern("flood")
        _native.bench_cpp_pair(20_000_000, name)
        peak_during = status_mb("VmHWM")
        stats = _native.stats()
        run.stop()
        print("RESULT", before, peak_during, stats["written"], stats["dropped"])
        loaded = stepscope.load(run.path, quiet=True)
        (folder,) = loaded.processes["process"]
        cols = _native.read_trace(f"{run.path}/{folder}/{TRACE_FILE}")
        flood = int((cols["name"] == list(cols["names"]).index("flood")).sum())
        print("LOADED", loaded.dropped_events, flood)
    """, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    _, before, peak, written, dropped = r.stdout.split("RESULT")[1].split("\n")[0].split(" ")
    before, peak, written, dropped = float(before), float(peak), int(written), int(dropped)
    assert peak - before <= 64, f"stepscope held {peak - before:.0f} MiB during the flood"
    loaded_dropped, loaded_events = map(int, r.stdout.split("LOADED")[1].split())
    # every event is either on disk or counted as dropped; readers see the count
    # (the system sampler's few events may be among the dropped ones)
    assert loaded_dropped == dropped
    assert 0 <= loaded_events + loaded_dropped - 20_000_000 <= 1000


def test_drops_are_counted_per_rank(tmp_path):
    """Two ranks, one flooding a 1 MiB buffer: the summary gives the drops per rank,
    and the text names the rank."""
    from stepscope.analysis.report.summary import dropped_where, format_text, summarize

    for rank in (0, 1):
        r = run_python(f"""
            import stepscope
            from stepscope.core import _native
            run = stepscope.start(dir="runs", name="two", buffer_mb=1)
            if {rank} == 1:
                _native.bench_cpp_pair(3_000_000, _native.intern("flood"))
            run.stop()
        """, cwd=tmp_path, env={"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)})
        assert r.returncode == 0, r.stderr
    s = summarize(str(tmp_path / "runs" / "two"))
    assert s["dropped_events"] > 0 and s["dropped_by_rank"] == {"1": s["dropped_events"]}
    assert f"{s['dropped_events']:,} events dropped (the writer could not keep up): rank 1 " in format_text(s)
    # named even when rank 1 is the only rank with events (rank 0 may record none before it stops)
    alone = {**s, "ranks": 1}
    assert f"could not keep up): rank 1 {s['dropped_events']:,}" in format_text(alone)
    # a process without a rank, alone in its run: nothing to name
    assert dropped_where({**s, "ranks": 1, "dropped_by_rank": {"host-123": s["dropped_events"]}}) == ""
