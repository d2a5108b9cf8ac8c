"""What recording other profilers' ranges costs (issue 15): torch.profiler.record_function
(torch's own per-step ranges, passed over by name, and a user's), and the nvtx package's
annotate, each timed plain and then with stepscope's integrations instrumented and a
session running.

    python3 bench/annotations.py [--calls 200000]

Prints the time of one ``with`` block, the best of seven repeats each. torch enters
record_function itself three times a step (optimizer step and zero_grad, the
DataLoader's ``__next__``): that is the per-step cost the torch integration adds
there (zero_grad's and the fetch's ranges report the loop: the zero_grad row).
"""

from __future__ import annotations

import argparse
import tempfile
import timeit


def best_us(fn, calls: int) -> float:
    return min(timeit.repeat(fn, number=calls, repeat=7)) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=200_000)
    calls = p.parse_args().calls

    import torch
    from torch.autograd.profiler import record_function

    try:
        import nvtx
    except ImportError:
        nvtx = None

    def torch_own():
        with record_function("Optimizer.step#SGD.step"):
            pass

    def zero_grad():  # routed natively to the loop (its span and the tracker's report)
        with record_function("Optimizer.zero_grad#SGD.zero_grad"):
            pass

    def user_range():
        with record_function("my_block"):
            pass

    def nvtx_range():
        with nvtx.annotate("my_block"):
            pass

    cases = [("record_function, torch's own name", torch_own),
             ("record_function, an optimizer's zero_grad", zero_grad),
             ("record_function, a user's name", user_range)]
    if nvtx is not None:
        cases.append(("nvtx.annotate", nvtx_range))
    plain = {name: best_us(fn, calls) for name, fn in cases}

    import stepscope
    from stepscope.integrations import nvtx as st_nvtx
    from stepscope.integrations import torch as st_torch

    with tempfile.TemporaryDirectory() as d:
        session = stepscope.start(dir=d, name="annotations")
        st_torch.instrumentor.ensure()
        if nvtx is not None:
            st_nvtx.instrumentor.ensure()
        profiled = {name: best_us(fn, calls) for name, fn in cases}
        session.stop()
    print(f"torch {torch.__version__}; {calls:,} calls, best of 7\n")
    print("| range | plain | under stepscope | added |")
    print("| --- | ---: | ---: | ---: |")
    for name, _ in cases:
        print(f"| {name} | {plain[name]:.2f} us | {profiled[name]:.2f} us | {profiled[name] - plain[name]:+.2f} us |")


if __name__ == "__main__":
    main()
