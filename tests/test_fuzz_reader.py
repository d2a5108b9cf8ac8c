"""The reader under damage (issue 41's "Done when"): mutated real traces through the
native reader and ``stepscope.load``, a corruption corpus through every command that
reads a run, and metadata files of the wrong shape. Readers run in a subprocess (a crash
must not take pytest down) under a memory cap; the fast suite uses a fixed seed and a
few dozen cases, the slow one (CI) a few hundred; ``FUZZ_SCALE=4`` (or more) multiplies
the slow campaigns for a longer search: ``FUZZ_SCALE=4 python3 -m tox -- -m slow tests/test_fuzz_reader.py``."""

import json
import os
import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.core.vocabulary import PROCESS_JSON, TRACE_FILE

import tracefile

def scaled(count: int) -> int:
    """A slow campaign's size: CI's (a few minutes in all), times FUZZ_SCALE for a longer search."""
    try:
        return max(1, int(count * float(os.environ.get("FUZZ_SCALE") or 1)))
    except ValueError:
        return count


MEMORY_CAP = 3 << 30  # address space of a reader process: a table sized by a bad id would exceed it

RECORD = """
import sys, torch, stepscope
from stepscope.core import _native, gpu_records
from stepscope.integrations.torch import instrument
torch.manual_seed(0)
run = stepscope.start(dir=sys.argv[1], name="base", flush_interval_ms=20, pysample_hz=400)
instrument()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(480, 16), torch.randn(480, 1)),
                                   batch_size=16)
t = _native.now()
for epoch in range(2):
    for i, (x, y) in enumerate(data):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        base = 10**9 + (epoch * 100 + i) * 100_000
        gpu_records.api("cudaLaunchKernel", base, base + 5_000, epoch * 1000 + i)
        gpu_records.kernel(f"kernel_{i % 3}", base + 10_000, base + 40_000, epoch * 1000 + i)
run.stop()
"""

# Reads every case folder given, printing a line per case: OK, or a failure with its reason.
READER = r"""
import os, resource, sys, traceback, warnings
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
warnings.simplefilter("ignore")
import stepscope
from stepscope.analysis import RunFormatError
from stepscope.core import _native

for i, case in enumerate(sys.argv[2:]):
    print("START", case, flush=True)
    trace = os.path.join(case, "p", "trace.ssc")
    try:
        try:
            c = _native.read_trace(trace)
            for k in ("names", "tracks", "warnings"):
                list(c[k])
        except ValueError as exc:  # documented: not a trace at all, one line naming the file
            assert trace in str(exc) and "\n" not in str(exc), str(exc)
        try:
            run = stepscope.load(case, cache=False, dataset=(i % 4 == 3))
        except RunFormatError as exc:
            assert case in str(exc) and "\n" not in str(exc), str(exc)
        else:
            for table in ("events", "steps", "phases", "system", "kernels", "samples", "processes"):
                getattr(run, table)
            run.sql("SELECT count(*) FROM steps")
        print("OK", case, flush=True)
    except MemoryError:
        print("FAIL", case, "MemoryError", flush=True)
    except Exception:
        print("FAIL", case, traceback.format_exc().replace("\n", " | "), flush=True)
"""


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """One real run (torch, Python samples, GPU records written through the test path)."""
    root = tmp_path_factory.mktemp("fuzzbase")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    r = subprocess.run([sys.executable, "-c", RECORD, str(root)], cwd=root, env=env, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    run = root / "base"
    (proc,) = [d for d in os.listdir(run) if os.path.isdir(run / d) and not d.startswith(".")]
    trace = open(run / proc / TRACE_FILE, "rb").read()
    kinds = {ch.type for ch in tracefile.parse(trace).chunks}
    assert {tracefile.NAMES, tracefile.TRACK, tracefile.EVENTS, tracefile.GPU, tracefile.PYSTACKS,
            tracefile.PYSAMPLES, tracefile.END} <= kinds, kinds
    return {"run": str(run), "process": proc, "trace": trace,
            "meta": open(run / proc / PROCESS_JSON).read(), "run_json": open(run / "run.json").read()}


# --- mutations ---------------------------------------------------------------------------

def _huge_varint(rnd):
    return bytes([0xFF] * rnd.randint(5, 12)) + bytes([rnd.randint(0, 0x7F)])


def mutate(data: bytes, rnd: random.Random) -> (bytes, str):
    """One damage of a trace, the kind drawn by ``rnd``: raw byte damage (caught by the CRC
    or the framing), or a chunk edited and sealed again (its CRC right), which reaches the
    decoders with values no writer makes."""
    kind = rnd.choice(["flip", "flips", "truncate", "insert", "delete", "header", "resealed", "varint",
                       "swap", "duplicate"])
    b = bytearray(data)
    if kind == "flip":
        at = rnd.randrange(len(b))
        b[at] ^= 1 << rnd.randrange(8)
        return bytes(b), f"flip byte {at}"
    if kind == "flips":
        for _ in range(rnd.randint(2, 40)):
            b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
        return bytes(b), "flips"
    if kind == "truncate":
        n = rnd.randrange(len(b))
        return bytes(b[:n]), f"truncate at {n}"
    if kind == "insert":
        at = rnd.randrange(len(b))
        return bytes(b[:at] + bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 64))) + b[at:]), f"insert at {at}"
    if kind == "delete":
        at = rnd.randrange(len(b))
        return bytes(b[:at] + b[at + rnd.randint(1, 64):]), f"delete at {at}"
    offsets = tracefile.chunk_offsets(data)
    at = rnd.choice(offsets)
    if kind == "header":  # one header field set to another value, CRC left as it was
        field, size = rnd.choice([(4, 1), (5, 1), (6, 2), (8, 4), (12, 4)])
        value = rnd.choice([0, 1, 0xFF, rnd.randrange(1 << (8 * size)), (1 << (8 * size)) - 1])
        b[at + field:at + field + size] = value.to_bytes(size, "little")
        return bytes(b), f"header field {field} of chunk at {at} = {value}"
    t = tracefile.parse(data)
    i = offsets.index(at)
    ch = t.chunks[i]
    if kind == "resealed" and ch.payload:  # payload bytes changed, CRC made right again
        p = bytearray(ch.payload)
        for _ in range(rnd.randint(1, 8)):
            p[rnd.randrange(len(p))] = rnd.randrange(256)
        ch.payload = bytes(p)
    elif kind == "varint":  # a huge varint where a count or an id was
        cut = rnd.randrange(len(ch.payload) + 1)
        ch.payload = ch.payload[:cut] + _huge_varint(rnd) + ch.payload[cut + rnd.randint(0, 3):]
    elif kind == "swap":  # a valid chunk retyped
        ch.type = rnd.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 200])
    elif kind == "duplicate":
        t.chunks.insert(rnd.randrange(len(t.chunks) + 1), tracefile.Chunk(ch.type, ch.payload))
    return t.to_bytes(), f"{kind} chunk {i} (type {ch.type})"


def _case(root, name, base, trace=None, meta=None, run_json=None) -> str:
    case = os.path.join(root, name)
    os.makedirs(os.path.join(case, "p"))
    with open(os.path.join(case, "p", TRACE_FILE), "wb") as f:
        f.write(base["trace"] if trace is None else trace)
    with open(os.path.join(case, "p", PROCESS_JSON), "w") as f:
        f.write(base["meta"] if meta is None else meta)
    with open(os.path.join(case, "run.json"), "w") as f:
        f.write(base["run_json"] if run_json is None else run_json)
    return case


def _read_all(cases):
    """Runs READER over the cases; returns {case: "OK" or the failure}."""
    r = subprocess.run([sys.executable, "-c", READER, str(MEMORY_CAP), *cases], capture_output=True, text=True,
                       timeout=30 + 5 * len(cases), cwd=os.path.dirname(cases[0]))
    results, current = {}, None
    for line in r.stdout.splitlines():
        word, _, rest = line.partition(" ")
        case, _, why = rest.partition(" ")
        if word == "START":
            current = case
        else:
            results[case] = "OK" if word == "OK" else why
    if r.returncode != 0:  # a crash: the case it was reading
        results[current] = f"reader died (exit {r.returncode}): {r.stderr[-2000:]}"
    return results


def _fuzz_traces(base, root, examples, seed):
    made = []

    @settings(max_examples=examples, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.randoms(use_true_random=False))
    def draw(rnd):
        data, how = mutate(base["trace"], random.Random(f"{seed}-{rnd.random()}"))
        made.append((_case(root, f"case{len(made):04d}", base, trace=data), how))

    draw()
    results = _read_all([c for c, _ in made])
    failures = [f"{how}: {results.get(c, 'not reached')}" for c, how in made if results.get(c) != "OK"]
    if failures:
        pytest.fail(f"{len(failures)} of {len(made)} cases failed:\n" + "\n".join(failures[:5]), pytrace=False)
    return len(made)


def test_mutated_traces_read_or_fail_cleanly(base_run, tmp_path):
    assert _fuzz_traces(base_run, str(tmp_path), examples=30, seed=41) >= 25


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_mutated_traces_read_or_fail_cleanly_long(base_run, tmp_path):
    n = scaled(150)
    assert _fuzz_traces(base_run, str(tmp_path), examples=n, seed=4141) >= 0.8 * n


# --- metadata of the wrong shape ------------------------------------------------------------

WRONG = [None, "x", 3, -1, 2 ** 64, 1e308, [], {}, [1, "a"], {"a": None}, True, "/dev/zero", "../x"]


def _metadata_cases(base, root, rnd, count):
    meta, info = json.loads(base["meta"]), json.loads(base["run_json"])
    cases = []
    for n in range(count):
        m, r = dict(meta), dict(info)
        target = m if n % 2 == 0 else r
        for _ in range(rnd.randint(1, 3)):
            key = rnd.choice(sorted(target) + ["clock_correction_ns"])
            if key == "clock" and isinstance(target.get(key), dict) and rnd.random() < 0.5:
                target[key] = {**target[key], rnd.choice(["realtime_ns", "monotonic_ns"]): rnd.choice(WRONG)}
            else:
                target[key] = rnd.choice(WRONG)
        text = [json.dumps(m), json.dumps(r)]
        if rnd.random() < 0.15:
            text[n % 2] = rnd.choice(["null", "[]", "1e400", '{"start_time": 1e400}', "{", "\xff"])
        cases.append(_case(root, f"meta{n:03d}", base, meta=text[0], run_json=text[1]))
    return cases


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("count", [16, pytest.param(scaled(60), marks=pytest.mark.slow, id="long")])
def test_wrong_shaped_metadata_reads(base_run, tmp_path, count):
    cases = _metadata_cases(base_run, str(tmp_path), random.Random(8), count)
    results = _read_all(cases)
    failures = [f"{c}: {why}" for c, why in results.items() if why != "OK"]
    if failures:
        pytest.fail(f"{len(failures)} of {count} cases failed:\n" + "\n".join(failures[:5]), pytrace=False)
    assert len(results) == count


# --- the corruption corpus through every command ---------------------------------------

# Runs each command line in this interpreter (one import of everything), as the console
# script does; prints per command: exit status, then its stderr.
CLI = r"""
import contextlib, io, json, os, resource, sys, traceback
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from stepscope.cli.main import main

for argv in json.loads(sys.argv[2]):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = "raised"
    print(json.dumps({"argv": argv, "code": code, "stderr": err.getvalue()}), flush=True)
"""


def commands(case, intact, out):
    return [["summary", case], ["summary", case, "--json"], ["report", case, "-o", os.path.join(out, "r.html")],
            *[["export", case, "--format", f, "-o", os.path.join(out, f"x.{f}")]
              for f in ("chrome", "perfetto", "parquet", "speedscope", "collapsed")],
            ["diff", intact, case], ["diff", case, intact], ["ls", os.path.dirname(case)],
            ["watch", case, "--every", "100ms", "--timeout", "300ms"],
            ["merge", case, "-o", os.path.join(out, "merged")]]


def _stack_pointing_nowhere(trace: bytes) -> bytes:
    """Every stack of the first PYSTACKS chunk given a frame far past the table (CRC right)."""
    t = tracefile.parse(trace)
    ch = next(c for c in t.chunks if c.type == tracefile.PYSTACKS)
    strings, frames, (first, stacks) = tracefile.parse_pystacks(ch.payload)
    ch.payload = tracefile.pystacks_payload([strings, frames, (first, [[p, 410_031] for p, _ in stacks])])
    return t.to_bytes()


def _corpus(base, root, rnd, count):
    """Known damage (a stack pointing nowhere, a pid of 65 bits), then random damage."""
    meta = json.loads(base["meta"])
    cases = [_case(root, "nowhere", base, trace=_stack_pointing_nowhere(base["trace"])),
             _case(root, "hugepid", base, meta=json.dumps({**meta, "pid": 2 ** 64, "threads": "x"}))]
    for n in range(count):
        data, _ = mutate(base["trace"], rnd)
        meta = None
        if n % 2 == 1:  # every other run's process.json has a field of the wrong shape too
            m = json.loads(base["meta"])
            m[rnd.choice(sorted(m))] = rnd.choice(WRONG)
            meta = json.dumps(m)
        cases.append(_case(root, f"run{n:03d}", base, trace=data, meta=meta))
    return cases


def _check_cli(base, tmp_path, count, seed):
    root = str(tmp_path / "runs")
    intact = _case(root, "intact", base)
    argvs = []
    for i, case in enumerate(_corpus(base, root, random.Random(seed), count)):
        out = str(tmp_path / f"out{i}")
        os.makedirs(out)
        argvs += commands(case, intact, out)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    r = subprocess.run([sys.executable, "-c", CLI, str(MEMORY_CAP), json.dumps(argvs)], capture_output=True,
                       text=True, timeout=60 + 20 * len(argvs), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"argv"')]
    assert len(results) == len(argvs)
    bad = []
    for res in results:
        lines = [ln for ln in res["stderr"].splitlines() if ln.strip()]
        if "Traceback" in res["stderr"] or res["code"] not in (0, 1, 2):
            bad.append(res)
        elif res["code"] != 0 and not (len(lines) >= 1 and any(part in lines[-1] for part in res["argv"][1:])):
            bad.append(res)  # a clean failure: its last line names the run or file
    assert not bad, json.dumps(bad[:3], indent=1)[:4000]


@pytest.mark.slow
def test_every_command_on_a_damaged_run(base_run, tmp_path):
    _check_cli(base_run, tmp_path, count=1, seed=7)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_command_on_a_damaged_run_long(base_run, tmp_path):
    _check_cli(base_run, tmp_path, count=scaled(5), seed=77)
