"""The reader says what it could not read and keeps the rest (issue 41, items 4-8):
names that are not UTF-8, damaged Python stacks, huge name ids, chunk headers under
the CRC, wrong-shaped metadata."""

import ctypes
import json
import os
import subprocess
import sys
import threading
import time
import warnings

import pytest

import stepscope
from stepscope.core import _native
from stepscope.core.vocabulary import PROCESS_JSON, TRACE_FILE

import tracefile
from conftest import run_python

CUT_NAME = "data-loader-éé".encode()[:15]  # the OS's 15 bytes end inside the second é


def _load(path, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = stepscope.load(path, **kwargs)
    return run, [str(w.message) for w in caught]


def _trace_of(run_path):
    (proc,) = [d for d in os.listdir(run_path) if os.path.isdir(os.path.join(run_path, d)) and not d.startswith(".")]
    return os.path.join(run_path, proc, TRACE_FILE)


def _record_steps(tmp_path, name, steps=50, thread_name=None):
    """A run whose 50 train steps run in a thread (named natively when thread_name is given)."""
    run = stepscope.start(dir=str(tmp_path / "runs"), name=name, flush_interval_ms=20)

    def loop():
        if thread_name is not None:
            libc = ctypes.CDLL(None)
            libc.pthread_self.restype = ctypes.c_ulong
            libc.pthread_setname_np.argtypes = [ctypes.c_ulong, ctypes.c_char_p]
            assert libc.pthread_setname_np(libc.pthread_self(), thread_name) == 0
        for _ in range(steps):
            stepscope.step()
            with stepscope.annotate("work"):
                pass
        stepscope.end_step()
        time.sleep(0.2)  # alive at a flush: its TRACK chunk (with its OS name) is written

    t = threading.Thread(target=loop)
    t.start()
    t.join()
    run.stop()
    return run.path


# --- item 4: text that is not UTF-8 -------------------------------------------------------

def test_thread_named_natively_with_a_cut_character_keeps_its_process(tmp_path):
    path = _record_steps(tmp_path, "cutname", thread_name=CUT_NAME)
    run, _ = _load(path)
    assert (run.events["name"] == "work").sum() == 50
    assert len(run.steps[run.steps["mode"] == "train"]) == 50
    names = {t[3] for t in _native.read_trace(_trace_of(path))["tracks"]}
    assert "data-loader-é\ufffd" in names  # the cut character reads as U+FFFD, the rest as written


def test_names_chunk_with_invalid_utf8_keeps_the_process(tmp_path):
    path = _record_steps(tmp_path, "badnames")
    trace = _trace_of(path)
    t = tracefile.parse(open(trace, "rb").read())
    for ch in t.chunks:
        if ch.type == tracefile.NAMES:
            entries = [(i, b"w\xffrk\xc3" if raw == b"work" else raw) for i, raw in tracefile.parse_names(ch.payload)]
            ch.payload = tracefile.names_payload(entries)
    open(trace, "wb").write(t.to_bytes())
    run, _ = _load(path)
    assert (run.events["name"] == "w\ufffdrk\ufffd").sum() == 50
    assert len(run.steps[run.steps["mode"] == "train"]) == 50


def test_summary_of_a_natively_named_thread_counts_its_steps(tmp_path):
    path = _record_steps(tmp_path, "cutsummary", thread_name=CUT_NAME)
    r = subprocess.run([sys.executable, "-m", "stepscope", "summary", "--json", path], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert json.loads(r.stdout)["steps"]["train"]["count"] == 50


# --- item 6: name ids ---------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda bad: _native.span(0, bad, _native.now()),
    lambda bad: _native.instant(0, bad),
    lambda bad: _native.counter(0, bad, 1.0),
    lambda bad: _native.gpu_record(0, 1, 2, name=bad),
])
def test_native_api_refuses_a_name_id_never_interned(tmp_path, call):
    run = stepscope.start(dir=str(tmp_path / "runs"), name="ids")
    try:
        known = _native.intern("known-name")
        call(known)  # an interned id is fine
        for bad in (0xFFFFFFFF, known + 10_000):
            with pytest.raises(ValueError, match="never interned"):
                call(bad)
    finally:
        run.stop()


def test_undefined_huge_name_id_reads_as_a_bounded_placeholder(tmp_path):
    """An events chunk naming id 0xFFFFFFFF (made by hand: the writer refuses it) costs
    one placeholder, not a name per id below it: read under a 1 GiB address-space cap."""
    path = _record_steps(tmp_path, "hugeid", steps=5)
    trace = _trace_of(path)
    t = tracefile.parse(open(trace, "rb").read())
    # one more events chunk: track 1, one instant named 0xFFFFFFFF at base time 0
    payload = (tracefile.varint(1) + tracefile.varint(1) + tracefile.varint(0) + tracefile.varint(0)
               + bytes([1 | (0 << 2)]) + tracefile.varint(0xFFFFFFFF) + tracefile.varint(0) + tracefile.varint(0))
    t.chunks.insert(len(t.chunks) - 1, tracefile.Chunk(tracefile.EVENTS, payload))
    # and a NAMES chunk defining an absurd id
    t.chunks.insert(1, tracefile.Chunk(tracefile.NAMES, tracefile.names_payload([(1 << 27, b"far")])))
    open(trace, "wb").write(t.to_bytes())
    r = run_python(f"""
        import resource, warnings
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        warnings.simplefilter("ignore")
        import stepscope
        run = stepscope.load({path!r})
        ev = run.events
        print(len(ev), (ev["name"] == "<name 4294967295>").sum(), (ev["name"] == "work").sum())
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    total, placeholders, work = map(int, r.stdout.split())
    assert (placeholders, work) == (1, 5)


def test_ids_that_keep_doubling_do_not_grow_tables(tmp_path):
    """Chunks that each define one id just inside "twice the table" would double a table
    per chunk if gaps counted as defined: the bound counts entries read."""
    path = _record_steps(tmp_path, "doubling", steps=3)
    trace = _trace_of(path)
    t = tracefile.parse(open(trace, "rb").read())
    size = len(tracefile.parse_names(t.chunks[0].payload))
    extra = []
    for _ in range(40):
        far = 2 * size + 65535
        extra.append(tracefile.Chunk(tracefile.NAMES, tracefile.names_payload([(far, b"x")])))
        size = far + 1
    t.chunks[1:1] = extra
    open(trace, "wb").write(t.to_bytes())
    c = _native.read_trace(trace)
    assert len(c["names"]) < 200_000
    assert any("malformed names chunk" in w for w in c["warnings"])
    run, _ = _load(path)
    assert (run.events["name"] == "work").sum() == 3


# --- item 7: the chunk header under the CRC -------------------------------------------------

def test_format_version_has_the_chunk_header_under_the_crc():
    assert tuple(_native.FORMAT_VERSION) >= (1, 3)  # 1.3: the CRC covers the chunk header


def test_flipped_type_bit_is_a_checksum_warning(tmp_path):
    path = _record_steps(tmp_path, "typeflip", steps=20)
    trace = _trace_of(path)
    data = bytearray(open(trace, "rb").read())
    events = [o for o in tracefile.chunk_offsets(bytes(data)) if data[o + 4] == tracefile.EVENTS]
    data[events[0] + 4] ^= 0x10  # EVENTS (3) becomes 19, a type no reader knows
    open(trace, "wb").write(bytes(data))
    run, caught = _load(path)
    assert any("trace.ssc: checksum mismatch in chunk at offset %d" % events[0] in w for w in caught), caught


def test_unknown_chunk_type_is_warned_about(tmp_path):
    """A chunk of a type this reader does not know (sound CRC: a newer writer's) is
    skipped with one warning naming the file, the type and the count."""
    path = _record_steps(tmp_path, "unknown", steps=5)
    trace = _trace_of(path)
    t = tracefile.parse(open(trace, "rb").read())
    for _ in range(3):
        t.chunks.insert(1, tracefile.Chunk(42, b"future"))
    open(trace, "wb").write(t.to_bytes())
    run, caught = _load(path)
    assert (run.events["name"] == "work").sum() == 5
    assert [w for w in caught if "trace.ssc: 3 chunk(s) of unknown type 42 skipped" in w], caught


def test_old_files_keep_the_payload_only_crc(tmp_path):
    """A 1.2 file (CRC over the payload only) reads back whole, with no warning."""
    path = _record_steps(tmp_path, "old", steps=7)
    trace = _trace_of(path)
    t = tracefile.parse(open(trace, "rb").read())
    t.minor = 2
    open(trace, "wb").write(t.to_bytes())
    run, caught = _load(path)
    assert (run.events["name"] == "work").sum() == 7
    assert not [w for w in caught if "checksum" in w]


# --- item 5: damaged Python stacks ----------------------------------------------------------

def _stack_chunks(run_path) -> int:
    """The PYSTACKS chunks written so far (a running session's trace: whole chunks only)."""
    try:
        data = open(_trace_of(run_path), "rb").read()
    except (OSError, ValueError):
        return 0
    return sum(1 for o in tracefile.chunk_offsets(data) if data[o + 4] == tracefile.PYSTACKS)


def _record_samples(tmp_path, name):
    """A run with Python stack samples written over several flushes (several PYSTACKS chunks):
    one shape of stacks until a flush wrote them, then another (new stacks) until a second
    did. Waited for, not timed: a loaded machine flushes late."""
    run = stepscope.start(dir=str(tmp_path / "runs"), name=name, flush_interval_ms=20, pysample_hz=500)

    def deep(n):
        return deep(n - 1) if n else sum(range(20_000))

    def deeper(n):
        return deeper(n - 1) if n else sum(range(20_000))

    for work, chunks in ((deep, 1), (deeper, 2)):
        t_end = time.monotonic() + 60  # (a bound for a broken writer, far beyond any load)
        i = 0
        while (i < 20 or _stack_chunks(run.path) < chunks) and time.monotonic() < t_end:
            stepscope.step()
            with stepscope.annotate("work"):
                work(i % 7)
            i += 1
    stepscope.end_step()
    run.stop()
    return run.path


def test_damaged_python_stacks_drop_and_count_their_samples(tmp_path):
    path = _record_samples(tmp_path, "stacks")
    whole, _ = _load(path, cache=False)
    total = len(whole.samples)
    trace = _trace_of(path)
    data = bytearray(open(trace, "rb").read())
    stacks = [o for o in tracefile.chunk_offsets(bytes(data)) if data[o + 4] == tracefile.PYSTACKS]
    assert len(stacks) >= 2, "the run should flush its stacks more than once"
    data[stacks[0] + tracefile.CHUNK_HEADER + 3] ^= 0x40  # the first stacks chunk fails its CRC
    open(trace, "wb").write(bytes(data))
    run, caught = _load(path, cache=False)
    lost = run.dropped_samples
    assert lost > 0
    assert len(run.samples) + lost == total  # every sample kept or counted
    assert [w for w in caught if f"trace.ssc: {lost} Python stack sample(s) dropped" in w], caught
    assert run.processes["dropped_samples"].sum() == lost
    assert run.samples["function"].notna().all()
    r = subprocess.run([sys.executable, "-m", "stepscope", "summary", "--json", path], capture_output=True,
                       text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["dropped_samples"] == lost


def test_stack_tables_pointing_nowhere_are_dropped_not_raised():
    """Tables as a damaged file leaves them (ids past the end, undefined marks, a parent
    after its child): only the readable stacks and their samples are kept."""
    import numpy as np
    from stepscope.analysis.store import stacks as samples

    u = samples.UNDEFINED
    py = {"strings": ["f", "file.py"],
          "frame_func": np.array([0, 0, 7, u], dtype=np.uint32), "frame_file": np.array([1, 1, 1, u], dtype=np.uint32),
          "frame_line": np.array([1, 2, 3, 0], dtype=np.int32),
          # 0 ok; 1 child of 0 ok; 2 frame string 7 missing; 3 child of 2; 4 frame undefined; 5 parent after it;
          # 6 undefined stack (-2); 7 frame id past the end; 8 parent past the table's end
          "stack_parent": np.array([-1, 0, -1, 2, -1, 6, -2, -1, 410031], dtype=np.int32),
          "stack_frame": np.array([0, 1, 2, 0, 3, 0, u, 9, 0], dtype=np.uint32),
          "stack": np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1], dtype=np.uint32),
          "time": np.arange(11, dtype=np.int64), "tid": np.ones(11, dtype=np.int64), "interval_ns": 1000}
    assert samples.stack_validity(py).tolist() == [True, True, False, False, False, False, False, False, False]
    assert samples.lost_samples(py) == 8


# --- item 8: wrong-shaped metadata ----------------------------------------------------------

@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    return _record_steps(tmp_path_factory.mktemp("meta"), "meta", steps=12, thread_name=CUT_NAME)


def _copy(run_path, tmp_path):
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(run_path, dst, ignore=shutil.ignore_patterns(".stepscope-cache"))
    return str(dst)


def _edit_json(path, edit, raw=None):
    if raw is not None:
        open(path, "w").write(raw)
        return
    data = json.load(open(path))
    open(path, "w").write(json.dumps(edit(data)))


def _set(key, value):
    def edit(d):
        d[key] = value
        return d
    return edit


PROCESS_CASES = {
    "null": (None, "null", "not a JSON object"),
    "trace-null": (_set("trace", None), None, "'trace'"),
    "correction-text": (_set("clock_correction_ns", "x"), None, "'clock_correction_ns'"),
    "pid-huge": (_set("pid", 2 ** 64), None, "'pid'"),
    "threads-text": (_set("threads", "x"), None, "'threads'"),
    "trace-device": (_set("trace", "/dev/zero"), None, "'trace'"),
    "clock-text": (_set("clock", {"realtime_ns": "x", "monotonic_ns": 1}), None, "'clock'"),
    "rank-float": (_set("rank", 0.5), None, "'rank'"),
}


@pytest.mark.parametrize("case", sorted(PROCESS_CASES))
def test_wrong_shaped_process_json_falls_back_naming_file_and_field(small_run, tmp_path, case):
    edit, raw, field = PROCESS_CASES[case]
    path = _copy(small_run, tmp_path)
    meta = os.path.join(os.path.dirname(_trace_of(path)), PROCESS_JSON)
    _edit_json(meta, edit, raw)
    run, caught = _load(path)
    assert len(run.steps[run.steps["mode"] == "train"]) == 12
    assert [w for w in caught if "process.json" in w and field in w], caught
    assert run.processes["pid"].iloc[0] > 0  # from the trace's header


RUN_CASES = {
    "versions-number": (_set("versions", 3), None, "'versions'"),
    "start-infinite": (None, '{"start_time": 1e400, "command": ["x"]}', "'start_time'"),
    "start-text": (_set("start_time", "x"), None, "'start_time'"),
    "command-number": (_set("command", 7), None, "'command'"),
    "list": (None, "[1, 2]", "not a JSON object"),
}


@pytest.mark.parametrize("case", sorted(RUN_CASES))
def test_wrong_shaped_run_json_falls_back_naming_file_and_field(small_run, tmp_path, case):
    edit, raw, field = RUN_CASES[case]
    path = _copy(small_run, tmp_path)
    _edit_json(os.path.join(path, "run.json"), edit, raw)
    run, caught = _load(path)
    assert len(run.steps[run.steps["mode"] == "train"]) == 12
    assert [w for w in caught if "run.json" in w and field in w], caught
    for args in (["summary", "--json"], ["report", "-o", str(tmp_path / "r.html")], ["diff", path],
                 ["ls", str(tmp_path)]):
        r = subprocess.run([sys.executable, "-m", "stepscope", args[0], *([path] if args[0] not in ("ls",) else []),
                            *args[1:]], capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert "Traceback" not in r.stderr, (args, r.stderr)
        assert r.returncode == 0, (args, r.stderr)


@pytest.mark.parametrize("damage", ["missing-key", "wrong-type", "not-a-list"])
def test_bad_dataset_manifest_rebuilds_the_dataset(small_run, tmp_path, damage):
    path = _copy(small_run, tmp_path)
    first, _ = _load(path, dataset=True)
    assert len(first.steps) == 12
    cache = os.path.join(path, ".stepscope-cache")
    (manifest,) = [os.path.join(d, "manifest.json") for d in (os.path.join(cache, x) for x in os.listdir(cache))
                   if os.path.exists(os.path.join(d, "manifest.json"))]
    saved = json.load(open(manifest))
    if damage == "missing-key":
        del saved["processes"][0]["partition"]
    elif damage == "wrong-type":
        saved["processes"][0]["events"] = "many"
    else:
        saved["processes"] = 3
    json.dump(saved, open(manifest, "w"))
    again, caught = _load(path, dataset=True)
    assert len(again.steps[again.steps["mode"] == "train"]) == 12
    assert json.load(open(manifest))["processes"][0]["partition"]  # written anew
