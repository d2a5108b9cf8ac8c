"""The conformance corpus (issues 12 and 21): real training patterns, profiled.

Every script in ``tests/conformance/`` is a small, self-contained training job
of a kind users write, with its truth on its first lines::

    # expect: {"train": 8, "eval": 4, "phases": {"train": ["GetNext", "Forward", ...]}}

Each script runs plain, then under ``STEPSCOPE=1`` (and, where the truth says
``"callback": true``, with ``--callback``: the script adds stepscope's
Lightning/Keras callback itself), each in a fresh working folder, and the two
must agree on everything the job itself does:

* the exit code and stdout;
* the set of files written in the working folder; model files (.pt, .pth,
  .keras, .ckpt) load in a clean process where stepscope cannot be imported,
  and load to the same thing as the plain run's;
* the Python warnings on stderr (lines with ``Warning:``, directories,
  addresses and pids stripped); no ``stepscope:`` line at all unless the truth
  names one (``"stderr"``).

And what stepscope recorded must be the truth (``stepscope summary --json``
and ``stepscope.load``):

* ``train``/``eval``/``predict``: step counts per mode (a mode not named: none).
  Train steps are optimizer steps (SPEC §3), eval steps eval batches.
* ``phases``: per mode, the set of canonical phases with any time in that mode
  (``optional``: per mode, phases that may be present or not, e.g. a Loss
  computed inside the model's forward).
* ``every``: per mode, phases every step of the mode has.
* ``spans``: exact numbers of phase spans by name (e.g. one ``Forward`` per
  model call, ``Recompute`` for activation checkpointing).
* ``annotations``: exact numbers of annotation events (spans and marks) by
  name, every name recorded (ranges the script makes for other profilers:
  ``record_function``, NVTX).
* ``ranks``: per rank, step counts per mode (distributed jobs).
* ``note``: a substring of a run.json note, for what could not be measured.
* ``same_lines``: a regular expression; its matches (groups) in stdout and
  stderr must be the same in both runs (a framework's own report, e.g.
  Lightning's profiler tables, whose timings differ from run to run).
* ``exit``: the script's own exit code (0 unless it crashes on purpose); the
  exception lines on stderr must be the same too.
* ``same_stderr``: stderr must be the plain run's byte for byte (tracebacks of
  the job's own errors included), but for the time and thread id of the native
  log lines TensorFlow's C++ prints itself (``I0000 00:00:<time> <tid> file:line]``).
* contiguity (every case; ``"contiguous": false`` opts out, with the reason in the
  script's docstring): the steps of each loop, with the intervals stepscope
  names in it (framework spans: a Keras fit's ``keras.validation_start`` and
  ``keras.epoch_end``, stepscope's own profiler windows), cover at least 97%
  of the loop's span (SPEC §3). A loop is a Keras ``fit`` (its ``keras.fit``
  span, from its first step), else a run of one thread's steps up to an end
  mark (a loader that ran out, a loop's end).
* ``collectives``: per rank, {kind: count} or {kind: [count, bytes]} of the collectives
  it issued (``run.collectives``); each step's exposed and overlapped communication
  add up to its communication.
* ``ddp_buckets``: per rank, DDP's bucket all-reduces (a framework's own collectives
  besides them are not counted).
* ``compilation``: fields of the summary's ``compilation`` block that must equal the
  framework's own counters, which the script prints in its truth run (the plain one) as
  ``compilation {json}``: ``recompiles`` and ``graph_breaks`` (dynamo's compilation
  metrics, and the functions it resumed in after a break: one per place), ``tf_functions``
  (per function, TensorFlow's tracing count).
* ``launch``: ``"torchrun"`` runs the script under ``torch.distributed.run``
  with two processes.

A case that fails today for a known cause is in ``XFAIL`` below, strict: it must
be removed from the table once the cause is fixed.
"""

import glob
import json
import os
import re
import subprocess
import sys
from collections import Counter

import pandas as pd
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "conformance")
SCRIPTS = sorted(glob.glob(os.path.join(CORPUS, "*.py")))
MODES = ("train", "eval", "predict")
MODEL_EXTENSIONS = (".pt", ".pth", ".keras", ".ckpt")
TIMEOUT = 300

# (script name, variant) -> the cause, found in stepscope (file/function). Strict:
# a case listed here that passes fails the suite, so fixed causes leave the table.
XFAIL: dict = {}


def truth_of(path):
    """The JSON object on the script's ``# expect:`` lines (within its first 30 lines, concatenated)."""
    with open(path) as f:
        head = [next(f, "") for _ in range(30)]
    parts = [line[len("# expect:"):].strip() for line in head if line.startswith("# expect:")]
    if not parts:
        raise AssertionError(f"{os.path.basename(path)} declares no truth (# expect: {{...}})")
    return json.loads(" ".join(parts))


def _cases():
    cases = []
    for path in SCRIPTS:
        name = os.path.splitext(os.path.basename(path))[0]
        variants = ["zero_edit"] + (["callback"] if truth_of(path).get("callback") else [])
        for variant in variants:
            marks = [pytest.mark.xdist_group(f"conformance-{name}")]  # both variants share the plain run
            if (name, variant) in XFAIL:
                marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[(name, variant)]))
            cases.append(pytest.param(name, variant, id=f"{name}-{variant}", marks=marks))
    return cases


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE") and k != "KERAS_BACKEND"}
    env.update(extra)
    return env


def _command(path, truth, extra_args=()):
    args = list(truth.get("args", [])) + list(extra_args)
    if truth.get("launch") == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", path,
                *args]
    return [sys.executable, path, *args]


class Job:
    def __init__(self, cwd, result):
        self.cwd = str(cwd)
        self.returncode = result.returncode
        self.stdout = result.stdout
        self.stderr = result.stderr

    def files(self):
        out = set()
        for root, dirs, files in os.walk(self.cwd):
            for f in files:
                out.add(os.path.relpath(os.path.join(root, f), self.cwd))
        return out

    def exceptions(self):
        return Counter(normalize_warning(line) for line in self.stderr.splitlines() if _EXCEPTION.match(line))

    def warnings(self):
        return Counter(normalize_warning(line) for line in self.stderr.splitlines() if "Warning:" in line)

    def stepscope_lines(self):
        return [line for line in (self.stdout + self.stderr).splitlines() if "stepscope:" in line]


class _Started:
    """A job running in the background (the plain run overlaps the profiled one)."""

    def __init__(self, base, path, truth, env, extra_args=()):
        self.cwd = base / "work"
        self.cwd.mkdir(parents=True)
        self.timeout = truth.get("timeout", TIMEOUT)
        self.proc = subprocess.Popen(_command(path, truth, extra_args), cwd=self.cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait(self):
        try:
            out, err = self.proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        return Job(self.cwd, subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err))


def _worker_died_of_a_signal(job) -> bool:
    """torchrun reports a worker killed by a signal (gloo's teardown has been seen to abort,
    'terminate called without an active exception', in plain runs too)."""
    return job.returncode != 0 and re.search(r"exitcode: -\d+", job.stderr or "") is not None


def run_job(base, path, truth, env, extra_args=()):
    return _Started(base, path, truth, env, extra_args).wait()


_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b.*")
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-+@~]+)+/(?=[\w.\-+@~]+)")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_PID = re.compile(r"\b(pid|process) ?\d+", re.IGNORECASE)


def normalize_warning(line):
    line = _PATH.sub("", line)
    line = _ADDRESS.sub("0x?", line)
    return _PID.sub(r"\1 ?", line).strip()


# A clean process: stepscope cannot be imported, the file is loaded the way its
# framework loads it, and a fingerprint of what loaded is printed (to compare
# the plain run's file with the profiled run's).
LOADER = r'''
import importlib.abc, json, os, sys, zipfile

assert not any(m == "stepscope" or m.startswith("stepscope.") for m in sys.modules), "stepscope preloaded"


class NoStepscope(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "stepscope" or name.startswith("stepscope.") or name.startswith("_stepscope"):
            raise ImportError(f"stepscope is not importable in this process ({name})")
        return None


sys.meta_path.insert(0, NoStepscope())


HERE = (os.getcwd(), os.path.realpath(os.getcwd()))


def key(k):
    k = str(k)
    for h in HERE:
        k = k.replace(h, "<cwd>")
    return k


def fingerprint(obj, depth=0):
    import torch
    if isinstance(obj, torch.Tensor):
        return [list(obj.shape), round(float(obj.detach().double().abs().sum()), 3)]
    if isinstance(obj, torch.nn.Module):
        return {"type": type(obj).__name__, "state": fingerprint(dict(obj.state_dict()), depth + 1)}
    if isinstance(obj, dict) and depth < 6:
        return {key(k): fingerprint(v, depth + 1) for k, v in sorted(obj.items(), key=lambda kv: key(kv[0]))}
    if isinstance(obj, (list, tuple)) and depth < 6:
        return [fingerprint(v, depth + 1) for v in obj]
    if isinstance(obj, (int, float, bool)) or obj is None:
        return obj
    return type(obj).__name__


out = {}
for name in sys.argv[1:]:
    if name.endswith(".keras"):
        import keras
        model = keras.saving.load_model(name)
        out[name] = {"type": type(model).__name__,
                     "weights": [round(float(abs(w).sum()), 3) for w in model.get_weights()]}
        continue
    import torch
    with zipfile.ZipFile(name) as z:
        scripted = any(n.split("/", 1)[-1].startswith("code/") for n in z.namelist())
    if scripted:
        out[name] = {"jit": fingerprint(torch.jit.load(name))}
    else:
        out[name] = fingerprint(torch.load(name, weights_only=False))
print("LOADED " + json.dumps(out, sort_keys=True))
'''


def load_models(job):
    models = sorted(f for f in job.files() if f.endswith(MODEL_EXTENSIONS))
    if not models:
        return {}
    r = subprocess.run([sys.executable, "-c", LOADER, *models], cwd=job.cwd, env=_env(), capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and "LOADED " in r.stdout, \
        f"model files of {job.cwd} do not load without stepscope:\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.split("LOADED ", 1)[1])


_plain_jobs = {}


@pytest.fixture(scope="session")
def plain_job(tmp_path_factory):
    """The plain run of a script, once per session (both variants compare with it)."""

    class Plain:
        args = {}  # name -> (path, truth) of the plain runs started

        def start(self, name, path, truth):
            """Starts the plain run unless it ran already; get() waits for it."""
            if name not in _plain_jobs:
                _plain_jobs[name] = _Started(tmp_path_factory.mktemp(f"{name}-plain"), path, truth, _env())
                self.args[name] = (path, truth)

        def get(self, name):
            job = _plain_jobs[name]
            if isinstance(job, _Started):
                job = job.wait()
                if _worker_died_of_a_signal(job):  # the reference itself crashed (no stepscope in it): once more
                    path, truth = self.args[name]
                    job = run_job(tmp_path_factory.mktemp(f"{name}-plain-again"), path, truth, _env())
                job.models = load_models(job)
                _plain_jobs[name] = job
            return job

    return Plain()


def summary_of(run_path):
    """What ``stepscope summary --json`` prints (same function, in this process:
    test_cli runs the command itself)."""
    from stepscope.analysis.report.summary import summarize

    return json.loads(json.dumps(summarize(str(run_path))))


def check_same_job(plain, prof):
    detail = f"\n--- profiled stderr ---\n{prof.stderr[-4000:]}"
    assert prof.returncode == plain.returncode, f"exit code {prof.returncode} != {plain.returncode}{detail}"
    assert prof.stdout == plain.stdout, f"stdout differs{detail}"
    files, want = prof.files(), plain.files()
    assert files == want, f"files written differ: only profiled {sorted(files - want)}, " \
                          f"only plain {sorted(want - files)}"
    models = load_models(prof)
    differ = sorted(f for f in set(models) | set(plain.models) if models.get(f) != plain.models.get(f))
    assert not differ, f"model files load to something else: {differ}\nplain: " + \
        "\n".join(json.dumps(plain.models.get(f), sort_keys=True)[:2000] for f in differ) + "\nprofiled: " + \
        "\n".join(json.dumps(models.get(f), sort_keys=True)[:2000] for f in differ)
    raised, want = prof.exceptions(), plain.exceptions()
    assert raised == want, f"exceptions differ: only profiled {dict(raised - want)}, only plain {dict(want - raised)}"
    warned, want = prof.warnings(), plain.warnings()
    assert warned == want, f"Python warnings differ: only profiled {dict(warned - want)}, " \
                           f"only plain {dict(want - warned)}"


def check_same_lines(plain, prof, truth):
    pattern = truth.get("same_lines")
    if pattern:
        def matches(job):
            rx = re.compile(pattern)
            return Counter(m.groups() or (m.group(0),) for line in (job.stdout + job.stderr).splitlines()
                           for m in [rx.search(line)] if m)
        want = matches(plain)
        assert want, f"the plain run printed nothing matching {pattern!r}"
        assert matches(prof) == want, f"lines matching {pattern!r} differ"


_NATIVE_LOG_STAMP = re.compile(r"^([IWEF])\d{4} [\d:.]+ +\d+ ", re.MULTILINE)


def check_same_stderr(plain, prof, truth):
    if truth.get("same_stderr"):
        want, got = (_NATIVE_LOG_STAMP.sub(r"\1 ", job.stderr) for job in (plain, prof))
        assert got == want, f"stderr differs:\n--- plain ---\n{want[-3000:]}\n--- profiled ---\n{got[-3000:]}"


def check_stepscope_lines(prof, truth):
    lines = prof.stepscope_lines()
    expected = truth.get("stderr")
    if expected is None:
        assert not lines, "stepscope printed:\n" + "\n".join(lines)
    else:
        assert lines and all(expected in line for line in lines), "stepscope printed:\n" + "\n".join(lines)


MIN_LOOP_COVER = 0.97


def _covered_ns(intervals, lo, hi):
    """Nanoseconds of [lo, hi) inside the union of intervals (start, end)."""
    total, reach = 0, lo
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += b - a
            reach = b
    return total


def _loops(steps, marks, fits):
    """(steps, span start, span end) per loop: each Keras fit, then runs of one thread's
    other steps up to an end mark."""
    out, inside = [], pd.Series(False, index=steps.index)
    for a, b in fits:
        s = steps[(steps["start_ns"] >= a) & (steps["start_ns"] < b)]  # the last may end with the session
        inside |= steps.index.isin(s.index)
        if len(s):
            out.append((s, int(s["start_ns"].min()), int(b)))
    for _, s in steps[~inside].groupby(["process", "tid"], observed=True):
        s = s.sort_values("start_ns")
        starts, ends = s["start_ns"].to_numpy(), s["end_ns"].to_numpy()
        cut = [0] + [i + 1 for i in range(len(s) - 1)
                     if ((marks >= ends[i]) & (marks <= starts[i + 1])).any()] + [len(s)]
        for i, j in zip(cut, cut[1:]):
            out.append((s.iloc[i:j], int(starts[i]), int(ends[j - 1])))
    return out


def check_contiguous(run_path, truth):
    """SPEC §3: each loop's steps, with the intervals stepscope names, cover >= 97% of it."""
    import stepscope

    if truth.get("contiguous") is False:
        return
    run = stepscope.load(run_path)
    ev = run.events
    for process, pev in ev.groupby("process", observed=True):
        steps = run.steps[run.steps["process"] == process]
        if not len(steps):
            continue
        marks = pev.loc[(pev["category"] == "step") & (pev["kind"] == "instant") & (pev["name"] == "end"),
                        "start_ns"].to_numpy()
        framework = pev[(pev["category"] == "framework") & (pev["kind"] == "span")]
        fits = list(zip(*(framework.loc[framework["name"] == "keras.fit", c] for c in ("start_ns", "end_ns"))))
        named = list(zip(framework.loc[framework["name"] != "keras.fit", "start_ns"],
                         framework.loc[framework["name"] != "keras.fit", "end_ns"]))
        for s, lo, hi in _loops(steps, marks, fits):
            if hi - lo <= 0 or len(s) < 2:
                continue
            covered = _covered_ns(list(zip(s["start_ns"], s["end_ns"])) + named, lo, hi)
            assert covered >= MIN_LOOP_COVER * (hi - lo), (
                f"{process}: a loop of {len(s)} steps ({dict(s.groupby('mode', observed=True).size())}) covers "
                f"{covered / (hi - lo):.1%} of its {(hi - lo) / 1e6:.1f} ms with its steps and named intervals")


def check_step_pass(run_path):
    """The native steps-and-phases pass equals its definition on this run (tests/test_step_pass.py)."""
    import pandas as pd
    import stepscope
    from stepscope.analysis.tables import stepping

    events = stepscope.load(run_path, cache=False, quiet=True).events
    native, reference = stepping.steps_and_phases(events), stepping.steps_and_phases(events, native=False)
    pd.testing.assert_frame_equal(native[0], reference[0])
    pd.testing.assert_frame_equal(native[1], reference[1])
    consumed = stepping.steps_and_phases(events.copy(), consume=True)  # (as the dataset build runs it)
    pd.testing.assert_frame_equal(consumed[0], reference[0])
    pd.testing.assert_frame_equal(consumed[1], reference[1])


def check_recorded(run_path, truth):
    import stepscope

    assert os.path.isfile(os.path.join(run_path, "run.json")), f"no run at {run_path}"
    summary = summary_of(run_path)
    counts = {mode: s["count"] for mode, s in summary["steps"].items() if s["count"]}
    expected = {mode: truth[mode] for mode in MODES if truth.get(mode)}
    assert counts == expected, f"steps per mode: recorded {counts}, truth {expected}"
    interrupted = summary.get("interrupted", {}).get("count", 0)  # iterations without their optimizer step
    assert interrupted == truth.get("interrupted", 0), f"interrupted steps: recorded {interrupted}, truth " \
                                                       f"{truth.get('interrupted', 0)}"

    run = stepscope.load(run_path)
    steps = run.steps
    phase_names = ("GetNext", "Forward", "Loss", "Backward", "Optimizer")
    recorded_phases = {}
    for mode in expected:
        s = steps[steps["mode"] == mode]
        recorded_phases[mode] = sorted(p for p in phase_names if (s[p] > 0).any())
    if "phases" in truth:
        optional = truth.get("optional", {})
        want = {mode: sorted(p) for mode, p in truth["phases"].items()}
        got = {mode: sorted(set(recorded_phases.get(mode, [])) - (set(optional.get(mode, [])) - set(p)))
               for mode, p in want.items()}
        assert got == want, f"phases per mode: recorded {got}, truth {want}"
        if "train" in want:  # the summary's phases are the train steps'
            summary_phases = sorted(set(summary["phases"]) - (set(optional.get("train", [])) - set(want["train"])))
            assert summary_phases == want["train"], summary["phases"]
    for mode, phases in truth.get("every", {}).items():
        s = steps[steps["mode"] == mode]
        missing = {p: int((s[p] <= 0).sum()) for p in phases if (s[p] <= 0).any()}
        assert not missing, f"{mode} steps without a phase (phase: steps): {missing}"
    if "spans" in truth:
        ev = run.events
        spans = ev[(ev["category"] == "phase") & (ev["kind"] == "span")]
        got = {name: int((spans["name"] == name).sum()) for name in truth["spans"]}
        assert got == truth["spans"], f"phase spans: recorded {got}, truth {truth['spans']}"
    if "annotations" in truth:
        ev = run.events
        marks = ev.loc[ev["category"] == "annotation", "name"].astype(str)
        got = dict(Counter(marks))
        assert got == truth["annotations"], f"annotations: recorded {got}, truth {truth['annotations']}"
    if "ranks" in truth:
        got = {}
        for (rank, mode), n in steps.groupby(["rank", "mode"], observed=True).size().items():
            if n:
                got.setdefault(str(int(rank)), {})[mode] = int(n)
        assert got == truth["ranks"], f"steps per rank: recorded {got}, truth {truth['ranks']}"
    if "collectives" in truth:  # per rank: {kind: count} or {kind: [count, bytes]}
        colls = run.collectives
        got = {}
        for (rank, kind), c in colls.groupby(["rank", "kind"]):
            got.setdefault(str(int(rank)), {})[kind] = [len(c), int(c["bytes"].sum())]
        want = {r: {k: v if isinstance(v, list) else [v, got.get(r, {}).get(k, [0, 0])[1]] for k, v in kinds.items()}
                for r, kinds in truth["collectives"].items()}
        assert got == want, f"collectives per rank (count, bytes): recorded {got}, truth {want}"
        for c in ("comm_exposed_ns", "comm_overlapped_ns"):
            assert (steps[c] >= 0).all()
        assert (steps["comm_exposed_ns"] + steps["comm_overlapped_ns"] == steps["comm_ns"]).all()
        assert (steps["comm_ns"] <= steps["duration_ns"]).all()
    if "ddp_buckets" in truth:  # per rank: DDP's bucket all-reduces (a framework's own syncs besides)
        colls = run.collectives
        got = {str(int(r)): int(n) for r, n in colls[colls["ddp"]].groupby("rank").size().items()}
        assert got == truth["ddp_buckets"], f"DDP buckets per rank: recorded {got}, truth {truth['ddp_buckets']}"
    if "note" in truth:
        with open(os.path.join(run_path, "run.json")) as f:
            notes = json.load(f).get("notes", [])
        assert any(truth["note"] in n for n in notes), f"no run.json note with {truth['note']!r}: {notes}"


def check_compilation(plain, run_path, truth):
    """The compile counts recorded equal what the framework counted in the plain run."""
    if "compilation" not in truth:
        return
    lines = [line for line in plain.stdout.splitlines() if line.startswith("compilation ")]
    assert lines, "the script printed no `compilation {json}` line (its framework's own counts)"
    counted = json.loads(lines[-1].split(" ", 1)[1])
    block = summary_of(run_path).get("compilation") or {}  # (none: nothing was compiled)
    for field in truth["compilation"]:
        if field == "tf_functions":
            got = {name: block.get("tf_functions", {}).get(name, {}).get("traces", 0) for name in counted[field]}
        else:
            got = block.get(field, 0)
        assert got == counted[field], f"compilation {field}: recorded {got}, the framework counted {counted[field]}"


@pytest.mark.slow  # the whole corpus: about 19 CPU minutes (2 runs of ~3-7 s a case); CI runs it (run_suite.py)
@pytest.mark.parametrize("name,variant", _cases())
def test_conformance(name, variant, tmp_path, plain_job):
    path = os.path.join(CORPUS, name + ".py")
    truth = truth_of(path)
    plain_job.start(name, path, truth)  # runs beside the profiled job: 2 cores, half the wall time
    runs = tmp_path / "runs"
    env = _env(STEPSCOPE_DIR=str(runs), STEPSCOPE_RUN="run")
    extra = ()
    if variant == "zero_edit":
        env["STEPSCOPE"] = "1"
    else:
        extra = ("--callback",)
    prof = run_job(tmp_path / variant, path, truth, env, extra)
    plain = plain_job.get(name)
    assert plain.returncode == truth.get("exit", 0), f"the script itself exits {plain.returncode}:\n" \
                                                     f"{plain.stderr[-3000:]}"
    check_same_job(plain, prof)
    check_same_lines(plain, prof, truth)
    check_same_stderr(plain, prof, truth)
    check_stepscope_lines(prof, truth)
    check_recorded(runs / "run", truth)
    check_compilation(plain, runs / "run", truth)
    check_contiguous(runs / "run", truth)
    check_step_pass(runs / "run")


def test_corpus_is_complete():
    """At least 32 patterns, every one declares its truth, names are unique."""
    assert len(SCRIPTS) >= 32, len(SCRIPTS)
    for path in SCRIPTS:
        truth = truth_of(path)
        assert any(truth.get(m) for m in MODES), path
    stale = {key for key in XFAIL if not os.path.isfile(os.path.join(CORPUS, key[0] + ".py"))}
    assert not stale, f"XFAIL names scripts that are gone: {stale}"
