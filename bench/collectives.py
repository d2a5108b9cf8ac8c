"""What recording a collective costs the thread that issues it (issue 46's goal: <= 2 us).

    python3 bench/collectives.py [--calls 200000]

One process, a running session, torch.distributed's collective wrapper
(``integrations/torch/_collectives.py``) around a stand-in collective that does
nothing, so the figure is stepscope's own work, not the backend's: finding the group,
numbering the collective, the call's span and its bytes, and for an async call
registering the completion callback on its future (the callback itself runs on the
backend's thread). Each figure: the median over rounds of (wrapped - bare) per call,
rounds interleaved. Then a real gloo all_reduce (world size 1, 4 KB), bare and
recorded, for scale.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

import stepscope
from stepscope.integrations.torch import _collectives


class _Context:  # what the wrapper needs of the torch instrumentor
    def is_compiling(self):
        return False

    def fail(self, exc):
        raise exc


class _Work:  # an async collective's work object: a future that completes later
    def __init__(self):
        self.future = torch.futures.Future()

    def get_future(self):
        return self.future


def per_call(fn, args, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=9)
    a = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
    dist.init_process_group("gloo", rank=0, world_size=1)
    tensor = torch.ones(1024)
    with tempfile.TemporaryDirectory() as tmp:
        run = stepscope.start(dir=tmp, name="bench-collectives", buffer_mb=256)
        rec = _collectives.Collectives(_Context(), dist)
        positions = (0, "tensor", 2, "group", 3, "async_op")
        works = [_Work() for _ in range(a.calls)]
        pending = iter(works)

        def sync_original(tensor, op=None, group=None, async_op=False):
            return None

        def async_original(tensor, op=None, group=None, async_op=False):
            return next(pending)

        sync_wrapped = rec.wrap("all_reduce", positions, sync_original)
        async_wrapped = rec.wrap("all_reduce", positions, async_original)
        out = {"sync": [], "async": []}
        for _ in range(a.rounds):
            bare = per_call(sync_original, (tensor,), a.calls)
            out["sync"].append(per_call(sync_wrapped, (tensor,), a.calls) - bare)
            pending = iter(works)
            bare = per_call(async_original, (tensor, None, None, True), a.calls)
            pending = iter(works)
            works[:] = [_Work() for _ in range(a.calls)]
            pending = iter(works)
            out["async"].append(per_call(async_wrapped, (tensor, None, None, True), a.calls) - bare)
            works[:] = [_Work() for _ in range(a.calls)]
            pending = iter(works)
        real = {"bare": [], "recorded": []}
        original = dist.all_reduce
        recorded = rec.wrap("all_reduce", positions, original)
        for _ in range(a.rounds):
            real["bare"].append(per_call(original, (tensor,), 2000))
            real["recorded"].append(per_call(recorded, (tensor,), 2000))
        run.stop()
    dist.destroy_process_group()
    print(f"torch {torch.__version__}; median of {a.rounds} interleaved rounds of {a.calls:,} calls")
    print("| what | per collective |")
    print("| --- | ---: |")
    print(f"| recording a synchronous collective (span, bytes) | {statistics.median(out['sync']) * 1e6:.2f} us |")
    print(f"| recording an async collective (span, bytes, completion callback registered) "
          f"| {statistics.median(out['async']) * 1e6:.2f} us |")
    b, r = statistics.median(real["bare"]), statistics.median(real["recorded"])
    print(f"| gloo all_reduce, 4 KB, world size 1: bare / recorded | {b * 1e6:.1f} us / {r * 1e6:.1f} us |")


if __name__ == "__main__":
    main()
