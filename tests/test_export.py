"""The Chrome export of a real 2-rank DDP run: one file per rank in PyTorch's layout, read by
Holistic Trace Analysis (ranks and steps found) and valid against the trace-event schema."""

import collections
import json
import os
import subprocess
import sys

import pytest

import stepscope
from stepscope.core.vocabulary import PHASES

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trace_event_schema.json")


@pytest.fixture(scope="module")
def ddp_export(tmp_path_factory):
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("ddp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    r = subprocess.run([sys.executable, "-m", "stepscope", "run", "--dir", "runs", "--name", "ddp", "--",
                        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--standalone", os.path.join(SCRIPTS, "ddp.py")],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    e = subprocess.run([sys.executable, "-m", "stepscope", "export", "runs/ddp", "--format", "chrome"], cwd=tmp,
                       env=env, capture_output=True, text=True, timeout=300)
    assert e.returncode == 0, e.stderr
    return stepscope.load(tmp / "runs" / "ddp", quiet=True), str(tmp / e.stdout.strip())


def test_one_file_per_rank_in_pytorchs_layout(ddp_export):
    import jsonschema

    run, folder = ddp_export
    assert sorted(os.listdir(folder)) == ["rank0.pt.trace.json", "rank1.pt.trace.json"]
    with open(SCHEMA) as f:
        validator = jsonschema.Draft202012Validator(json.load(f))
    bases = set()
    for rank in (0, 1):
        with open(os.path.join(folder, f"rank{rank}.pt.trace.json")) as f:
            trace = json.load(f)
        errors = list(validator.iter_errors(trace))
        assert not errors, errors[:3]
        assert trace["distributedInfo"] == {"rank": rank, "world_size": 2}
        bases.add(trace["baseTimeNanoseconds"])
        events = trace["traceEvents"]
        steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
        assert [e["name"] for e in steps] == [f"ProfilerStep#{i}" for i in range(10)]  # 640 samples, 2 ranks, 32
        assert all(e["cat"] == "user_annotation" and e["ph"] == "X" for e in steps)
        ours = run.steps[run.steps["rank"] == rank].sort_values("step")
        assert [round(e["dur"], 3) for e in steps] == [round(d / 1e3, 3) for d in ours["duration_ns"]]
        cats = {e["name"]: e["cat"] for e in events if e["ph"] == "X"}
        assert cats["Forward"] == "user_annotation" and cats["Optimizer.zero_grad"] == "cpu_op"
        phases = collections.Counter(e["name"] for e in events if e["name"] in PHASES)
        # five phases a step (the fetch that ran out is after the loop: an "end of data" span, no GetNext)
        assert phases == {"GetNext": 10, "Forward": 10, "Loss": 10, "Backward": 10, "Optimizer": 10}
        assert sum(e["name"] == "end of data" for e in events) == 1
    assert len(bases) == 1  # one time base: the ranks line up


def test_holistic_trace_analysis_finds_ranks_and_steps(ddp_export):
    hta = pytest.importorskip("hta.trace_analysis")

    _, folder = ddp_export
    analysis = hta.TraceAnalysis(trace_dir=folder)
    trace = analysis.t
    assert sorted(trace.get_ranks()) == [0, 1]
    for rank in (0, 1):
        df = trace.get_trace(rank)
        names = df["name"].map(trace.symbol_table.sym_table.__getitem__)
        # HTA keeps whole iterations: the last ProfilerStep bounds the trace and is dropped
        assert sorted(set(df["iteration"].tolist()) - {-1}) == list(range(9))
        assert names.str.startswith("ProfilerStep#").sum() == 9
        assert (names == "Forward").sum() >= 9
