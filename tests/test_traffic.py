"""Traffic other than the torch.distributed collectives (issue 57): point-to-point calls
(send/recv, isend/irecv, batch_isend_irecv, pipelining schedules) and functional
collectives (DTensor, tensor parallelism, FSDP2's clip_grad_norm_), recorded zero-edit
from real gloo jobs under torchrun (tests/scripts/traffic_jobs.py). Counts are held
against the job's own counting wrappers, in the same run."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

import stepscope
from stepscope.analysis.report.summary import summarize

pytestmark = pytest.mark.slow  # two-rank pipeline jobs over gloo: a minute of the cores (CI runs them)
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "traffic_jobs.py")


def _torchrun(job, tmp):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    env.update(STEPSCOPE="1", STEPSCOPE_DIR=str(tmp), STEPSCOPE_RUN=job)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                          SCRIPT, job], cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "stepscope" not in out.stderr, out.stderr[-3000:]  # (nor a dynamo warning about a wrapper of ours)
    truths = [json.loads(line.split("truth", 1)[1]) for line in out.stdout.splitlines() if line.startswith("truth")]
    return {t["rank"]: t for t in truths}, os.path.join(str(tmp), job)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("traffic")
    return {job: _torchrun(job, tmp) for job in ("p2p", "pipeline", "tp", "fsdpclip", "compiled")}


def _counts(run):
    c = run.collectives
    return c.groupby(["rank", "kind", "group"]).size().to_dict()


def _channels(truth, rank):
    return {(rank, k.split()[0], "p2p:" + k.split()[1]): n for k, n in truth[rank].items()
            if k.startswith(("send ", "recv "))}


def test_point_to_point_calls_are_recorded_per_channel_and_matched(jobs):
    truth, path = jobs["p2p"]
    run = stepscope.load(path, quiet=True)
    counts = _counts(run)
    for rank in (0, 1):
        want = _channels(truth, rank)
        assert want and {k: counts.get(k) for k in want} == want
    assert want[(1, "send", "p2p:1>0")] == 2 * truth[1]["rounds"]  # send, isend
    c = run.collectives
    p2p = c[c["group"].str.startswith("p2p:")]
    assert (p2p["bytes"] == 4096).all()
    # gloo gives p2p works no future: each completes where its wait returned
    recv0 = p2p[(p2p["rank"] == 0) & (p2p["kind"] == "recv")]
    assert (recv0["end_ns"] > recv0["issued_ns"]).mean() > 0.9
    # rank 1 sleeps 20 ms before each answer: rank 0 waits for it at its recv
    s = summarize(path)
    waited = {w["rank"]: w for w in s["communication"]["waited_for"]}
    assert waited[1]["waited_ms"] > 0.8 * 20 * truth[1]["rounds"], waited


def test_a_pipeline_schedules_transfers_and_bubbles(jobs):
    truth, path = jobs["pipeline"]
    run = stepscope.load(path, quiet=True)
    counts = _counts(run)
    for rank in (0, 1):
        want = _channels(truth, rank)
        assert {k: counts.get(k) for k in want} == want
    # every microbatch's activation goes 0 -> 1 and its gradient 1 -> 0 in every step (and the
    # shapes are exchanged once)
    assert truth[0]["send 0>1"] >= truth[0]["steps"] * truth[0]["micro"]
    s = summarize(path)
    comm = s["communication"]
    assert set(comm["by_kind"]) >= {"send", "recv"}
    assert comm["exposed_share"] > 0.05  # the bubble: a stage blocked waiting for its neighbour
    steps = run.steps[run.steps["mode"] == "train"]
    assert (steps["comm_exposed_ns"] + steps["comm_overlapped_ns"] == steps["comm_ns"]).all()
    for f in s["findings"]:  # advice follows what was recorded: no gradient all-reduce here
        assert "all-reduce" not in f["message"] + f["recommendation"], f


@pytest.mark.alone  # a straggler is named only where the job has the host to itself
def test_the_heavier_pipeline_stage_is_the_straggler(jobs):
    _, path = jobs["pipeline"]
    found = {f["rule"]: f for f in summarize(path)["findings"]}
    if "LoadBalancing" in found:
        assert found["LoadBalancing"]["evidence"]["slow_rank"] == 1
        assert found["LoadBalancing"]["evidence"]["pipeline"] is True
        assert "stages" in found["LoadBalancing"]["recommendation"]
    else:  # (a net cost under LoadBalancing's floor: the exposed time's cause names it)
        assert found["CommunicationBound"]["evidence"]["straggler_rank"] == 1
        assert "stages" in found["CommunicationBound"]["recommendation"]


def test_tensor_parallel_all_reduces_are_recorded_with_their_wait(jobs):
    truth, path = jobs["tp"]
    run = stepscope.load(path, quiet=True)
    c = run.collectives
    for rank in (0, 1):
        mine = c[(c["rank"] == rank) & (c["kind"] == "all_reduce")]
        assert len(mine) == truth[rank]["functional all_reduce"] == truth[rank]["forwards"]
        assert mine["is_async"].all()
        assert (mine["end_ns"] > mine["issued_ns"]).all()  # completed where its result was waited for
    # the same collective numbers on both ranks: matched
    ar = c[c["kind"] == "all_reduce"]
    assert ar.groupby("seq")["rank"].nunique().eq(2).all()
    waits = run.events[(run.events["category"] == "comm") & (run.events["name"] == "wait")]
    assert waits.groupby("rank").size().min() >= truth[0]["forwards"]


def test_fsdp2_clip_grad_norm_all_reduce_is_recorded(jobs):
    truth, path = jobs["fsdpclip"]
    run = stepscope.load(path, quiet=True)
    c = run.collectives
    for rank in (0, 1):
        mine = c[c["rank"] == rank]
        assert (mine["kind"] == "all_reduce").sum() == truth[rank]["functional all_reduce"] == truth[rank]["clips"]
        assert {"all_gather", "reduce_scatter"} <= set(mine["kind"])


def test_collectives_inside_a_compiled_graph_are_named_as_left_out(jobs):
    """Dynamo keeps a functional all-reduce in its graph; no wrapper runs there. The sampled
    operator windows see it: the summary names it as traffic its figures leave out."""
    truth, path = jobs["compiled"]
    run = stepscope.load(path, quiet=True)
    assert not (run.collectives["kind"] == "all_reduce").any()  # (nothing recorded from the graph)
    c = summarize(path)["communication"]
    assert c["left_out"]["ops"]["_c10d_functional::all_reduce"] >= 2  # (in both ranks' sampled steps)
    assert "compiled graph" in c["left_out"]["note"]
