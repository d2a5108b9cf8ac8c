"""What recording a collective costs the thread that issues it (issue 46's goal: <= 2 us).

    python3 bench/collectives.py [--calls 200000] [--rounds 9]

One process, a running session, torch.distributed's collective wrapper
(``integrations/torch/_collectives.py``) around a stand-in collective that does
nothing and returns real c10d works, so the figure is stepscope's own work, not the
backend's: finding the group, numbering the collective, the call's span and its bytes;
for an async call, keeping its work until the program waits for it (then the wait's
span and the completion) or takes its future (then a completion callback on it); a
DDP bucket, through stepscope's comm hook (a callback on the future the hook returns).
Callbacks run on the backend's thread, not counted here. Each figure: the fastest
recorded round minus the fastest bare round, per call (a busy machine only adds time:
the fastest round is the code's own cost), with the median of the per-round differences
beside it; rounds interleaved, the garbage collector off
while timing (the bench keeps 100,000s of works alive; a job keeps a few). Then a real
gloo all_reduce (world size 1, 4 KB), bare and recorded, for scale.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

import stepscope
from stepscope.integrations.torch import _collectives


class _Context:  # what the wrapper needs of the torch instrumentor
    compiler = torch.compiler

    def is_dynamo_compiling(self):
        return False

    def fail(self, exc):
        raise exc


def works(n: int, completed: bool) -> list:
    """Real c10d works (made from futures, as a backend's are), completed or not."""
    from torch._C._distributed_c10d import _create_work_from_future

    out = []
    for _ in range(n):
        future = torch.futures.Future()
        if completed:
            future.set_result(None)
        out.append(_create_work_from_future(future))
    return out


def per_call(fn, args, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t) / calls


def timed(issue, then, args, pending: list, source: list) -> float:
    """Seconds per (issue the collective, then ``then`` on its work), over ``pending`` (the
    works the stand-in collective returns, through ``source``)."""
    source[0] = iter(pending).__next__
    gc.disable()  # the bench's 100,000s of live works would make every collection a long one
    try:
        t = time.perf_counter()
        for _ in range(len(pending)):
            work = issue(*args)
            if then is not None:
                then(work)
        return (time.perf_counter() - t) / len(pending)
    finally:
        gc.enable()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=9)
    a = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
    dist.init_process_group("gloo", rank=0, world_size=1)
    tensor = torch.ones(1024)
    Work = dist.distributed_c10d.Work
    with tempfile.TemporaryDirectory() as tmp:
        run = stepscope.start(dir=tmp, name="bench-collectives", buffer_mb=256)
        rec = _collectives.Collectives(_Context(), dist)
        positions = (0, "tensor", 2, "group", 3, "async_op")
        source = [None]

        def sync_original(tensor, op=None, group=None, async_op=False):
            return None

        def async_original(tensor, op=None, group=None, async_op=False):
            return source[0]()

        sync_wrapped = rec.wrap("all_reduce", positions, sync_original)
        async_wrapped = rec.wrap("all_reduce", positions, async_original)
        wait, get_future = Work.wait, Work.get_future
        wrapped_wait, wrapped_get_future = rec.wrap_wait(wait), rec.wrap_get_future(get_future)

        class Bucket:  # what stepscope's DDP hook asks of a bucket
            def is_last(self):
                return False

        def hook(issue, take_future):  # torch's allreduce_hook: the async all-reduce, its future
            return lambda state, bucket: take_future(issue(tensor, None, None, True))

        bucket, bare_hook = Bucket(), functools.partial(hook(async_original, get_future), None)
        recorded_hook = functools.partial(_collectives._ddp_hook, _collectives._LOCAL,
                                          _collectives._HookState(hook(async_wrapped, wrapped_get_future), None))
        cases = {  # what: (bare issue, bare then, recorded issue, recorded then, args, works completed)
            "sync": (sync_original, None, sync_wrapped, None, (tensor,), None),
            "async": (async_original, None, async_wrapped, None, (tensor, None, None, True), False),
            "waited": (async_original, wait, async_wrapped, wrapped_wait, (tensor, None, None, True), True),
            "ddp": (bare_hook, None, recorded_hook, None, (bucket,), False),
            "future": (async_original, get_future, async_wrapped, wrapped_get_future, (tensor, None, None, True),
                       False),
        }
        out = {case: ([], []) for case in cases}  # (bare, recorded) seconds per call, by round
        for _ in range(a.rounds):
            for case, (bare, bare_then, recorded, recorded_then, args, completed) in cases.items():
                pending = [None] * a.calls if completed is None else works(a.calls, completed)
                out[case][0].append(timed(bare, bare_then, args, pending, source))
                pending = [None] * a.calls if completed is None else works(a.calls, completed)
                out[case][1].append(timed(recorded, recorded_then, args, pending, source))
                del pending
        real = {"bare": [], "recorded": []}
        original = dist.all_reduce
        recorded = rec.wrap("all_reduce", positions, original)
        for _ in range(a.rounds):
            real["bare"].append(per_call(original, (tensor,), 2000))
            real["recorded"].append(per_call(recorded, (tensor,), 2000))
        run.stop()
    dist.destroy_process_group()
    print(f"torch {torch.__version__}; {a.rounds} interleaved rounds of {a.calls:,} calls")
    print("| what | per collective (fastest rounds) | median of rounds |")
    print("| --- | ---: | ---: |")
    rows = {"sync": "a synchronous collective (span, bytes)",
            "async": "an async collective, its call alone (span, bytes, its work kept for its completion)",
            "waited": "an async collective and its wait (span, bytes; the wait's span, completion at the wait)",
            "ddp": "a DDP bucket's all-reduce, through stepscope's comm hook (span, bytes, completion "
                   "callback on the future the hook returns)",
            "future": "an async collective whose future the program takes (span, bytes, completion callback "
                      "registered)"}
    for case, what in rows.items():
        bare, recorded = out[case]
        per_round = statistics.median(r - b for b, r in zip(bare, recorded))
        print(f"| recording {what} | {(min(recorded) - min(bare)) * 1e6:.2f} us | {per_round * 1e6:.2f} us |")
    b, r = statistics.median(real["bare"]), statistics.median(real["recorded"])
    print(f"| gloo all_reduce, 4 KB, world size 1: bare / recorded | | {b * 1e6:.1f} us / {r * 1e6:.1f} us |")


if __name__ == "__main__":
    main()
