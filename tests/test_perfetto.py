"""The Perfetto export, parsed with Perfetto's own compiled protobuf classes (PyPI `perfetto`):
every slice's name, begin/end balance per track, slices equal to the events and steps tables."""

import collections
import os
import subprocess
import sys
import zlib

import pytest

import stepscope

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def _slices(path):
    """Reads a trace the way Perfetto does: sequences with interned names, defaults and an
    incremental clock; returns track descriptors by uuid and per track its closed slices
    (name, category, start_ns, end_ns) plus instants, failing on any unbalanced end."""
    pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    descriptors, seqs = {}, {}
    slices = collections.defaultdict(list)
    stacks = collections.defaultdict(list)
    packets = []
    for p in trace.packet:  # compressed_packets (zlib) hold more packets, in their place
        if p.HasField("compressed_packets"):
            inner = pb.Trace()
            inner.ParseFromString(zlib.decompress(p.compressed_packets))
            packets.extend(inner.packet)
        else:
            packets.append(p)
    for p in packets:
        seq = p.trusted_packet_sequence_id
        if p.HasField("track_descriptor"):
            descriptors[p.track_descriptor.uuid] = p.track_descriptor
            continue
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            seqs[seq] = {"names": {n.iid: n.name for n in p.interned_data.event_names},
                         "cats": {c.iid: c.name for c in p.interned_data.event_categories},
                         "track": p.trace_packet_defaults.track_event_defaults.track_uuid, "time": None}
            assert p.trace_packet_defaults.timestamp_clock_id == 64
            continue
        state = seqs[seq]
        if p.HasField("clock_snapshot"):
            clocks = {c.clock_id: c for c in p.clock_snapshot.clocks}
            assert clocks[64].is_incremental and clocks[64].timestamp == clocks[6].timestamp == p.timestamp
            state["time"] = clocks[64].timestamp
            continue
        assert p.sequence_flags == pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE and p.HasField("track_event")
        state["time"] += p.timestamp
        e, track = p.track_event, state["track"]
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stacks[track].append((state["names"][e.name_iid], state["cats"][e.category_iids[0]], state["time"]))
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:
            assert stacks[track], f"an end without a begin on track {track}"
            name, cat, start = stacks[track].pop()
            assert start <= state["time"]
            slices[track].append((name, cat, start, state["time"]))
        else:
            assert e.type == pb.TrackEvent.TYPE_INSTANT
            slices[track].append((state["names"][e.name_iid], state["cats"][e.category_iids[0]], state["time"], None))
    assert not any(stacks.values()), "slices left open"
    return descriptors, slices


def _export(tmp_path, run_path, *extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    e = subprocess.run([sys.executable, "-m", "stepscope", "export", str(run_path), "--format", "perfetto", *extra],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert e.returncode == 0, e.stderr
    return e.stdout.strip()


@pytest.mark.slow
def test_pytorch_run_exports_every_span_and_step(tmp_path):
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    r = subprocess.run([sys.executable, "-m", "stepscope", "run", "--dir", "runs", "--name", "pt", "--",
                        sys.executable, os.path.join(SCRIPTS, "loops.py"), "accum", "6"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    run = stepscope.load(tmp_path / "runs" / "pt", quiet=True)
    out = _export(tmp_path, run.path)
    assert out == os.path.join(run.path, "pt.perfetto-trace")
    descriptors, slices = _slices(out)

    procs = {d.process.pid: d for d in descriptors.values() if d.HasField("process")}
    assert sorted(procs) == sorted(run.processes["pid"].astype(int))
    assert {d.process.process_name for d in procs.values()} == set(run.processes["process"])
    ev = run.events
    spans = ev[ev["kind"] == "span"]
    threads = {(d.thread.pid, d.thread.tid): uuid for uuid, d in descriptors.items() if d.HasField("thread")}
    assert descriptors[threads[(run.processes["pid"].iloc[0], run.processes["pid"].iloc[0])]].thread.thread_name \
        == "MainThread"
    assert len(spans) > 50 and spans["category"].isin(["phase", "op"]).any()
    for (pid, tid), group in spans.groupby(["pid", "tid"], observed=True):
        got = sorted((s[0], s[2], s[3]) for s in slices[threads[(pid, tid)]] if s[3] is not None)
        want = sorted(zip(group["name"].astype(str), group["start_ns"], group["end_ns"]))
        assert got == want  # every span once, same name, same ns times
    n_spans = sum(1 for uuid in threads.values() for s in slices[uuid] if s[3] is not None)
    assert n_spans == len(spans)
    phases = [s for uuid in threads.values() for s in slices[uuid] if s[0] == "Forward"]
    assert len(phases) == 24 and {s[1] for s in phases} == {"user_annotation"}  # 6 steps x 4 micro-batches

    step_tracks = [uuid for uuid, d in descriptors.items() if d.name == "steps"]
    assert len(step_tracks) == 1 and descriptors[step_tracks[0]].parent_uuid in descriptors
    got = sorted((s[2], s[0], s[3]) for s in slices[step_tracks[0]])
    want = sorted((int(s.start_ns), f"ProfilerStep#{s.step}", int(s.end_ns)) for s in run.steps.itertuples())
    assert got == want and len(got) == 6


def test_gpu_streams_and_cuda_calls_get_tracks(run_dir, tmp_path):
    import time

    from stepscope.core import gpu_records as rec

    s = stepscope.start(name="gpu", gpu="off")
    t0 = time.monotonic_ns()
    for step in range(3):
        stepscope.step()
        with stepscope.phase("Forward"):
            t = time.monotonic_ns()
            rec.api("cudaLaunchKernel", t, t + 4_000, 10 + step)
            rec.kernel("gemm", t + 50_000, t + 90_000, 10 + step, stream=7)
            rec.memcpy("HtoD", 4096, t + 100_000, t + 100_000, 20 + step, stream=9)  # zero-length
            time.sleep(0.002)
    stepscope.end_step()
    rec.sync("stream_synchronize", t0, t0 + 10, 99)
    s.stop()
    run = stepscope.load(s.path, quiet=True)
    descriptors, slices = _slices(_export(tmp_path, s.path, "-o", str(tmp_path / "g.perfetto-trace")))
    by_name = {d.name: uuid for uuid, d in descriptors.items() if d.name}
    gpu = by_name[next(n for n in by_name if n.startswith("GPU 0"))]
    assert descriptors[by_name["stream 7"]].parent_uuid == gpu
    kernels = slices[by_name["stream 7"]]
    assert [(k[0], k[1], k[2], k[3]) for k in kernels] == [
        ("gemm", "kernel", int(a), int(b)) for a, b in zip(run.kernels["start_ns"], run.kernels["end_ns"])]
    copies = slices[by_name["stream 9"]]
    assert len(copies) == 3 and all(c[2] == c[3] and c[1] == "gpu_memcpy" for c in copies)
    assert [c[0] for c in slices[by_name["context (syncs)"]]] == ["Sync stream_synchronize"]
    calls = next(uuid for n, uuid in by_name.items() if n.startswith("CUDA API"))
    assert [c[0] for c in slices[calls]] == ["cudaLaunchKernel"] * 3
