"""What listening to compilation costs (issue 59): torch.compile's compile, and every call
of a tf.function.

    python3 bench/compile_listeners.py [--rounds 7] [--calls 20000]

* torch: a small model compiled (``aot_eager``) and run once, dynamo reset before each
  round, with the torch integration instrumented (its compile listener, graph-break
  and limit wrappers, and the module hooks the compiled forward traces through) and
  without, rounds interleaved. The listener runs once per compile, never per step.
* TensorFlow: calls of a small ``tf.function`` (already traced and run), with the tf
  integration instrumented (its trace wrapper and ``AtomicFunction.call_flat``'s, which
  times each built function's first two runs and costs a look-up on every later call)
  and without, rounds interleaved.

Each figure: the median over rounds of (instrumented - plain). A session is running in
both (recording on), so the difference is the listening alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def interleaved(timed, integration, rounds: int) -> tuple:
    """(median plain time, median of (instrumented - plain) per round): ``timed()`` with the
    integration off, then on, round by round; one call before, for imports and set-up."""
    timed()
    plain, listened = [], []
    for _ in range(rounds):
        plain.append(timed())
        integration.instrument()
        try:
            listened.append(timed())
        finally:
            integration.uninstrument()
    return statistics.median(plain), statistics.median(b - a for a, b in zip(plain, listened))


def torch_rounds(rounds: int) -> tuple:
    import torch
    import torch._dynamo

    from stepscope.integrations import torch as st_torch

    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    x = torch.randn(16, 64)

    def compile_once() -> float:
        torch._dynamo.reset()
        t = time.perf_counter()
        torch.compile(model, backend="aot_eager")(x).sum().backward()
        return time.perf_counter() - t

    return interleaved(compile_once, st_torch, rounds)


def tf_rounds(rounds: int, calls: int) -> tuple:
    import tensorflow as tf

    from stepscope.integrations import tfdata

    tf.config.threading.set_intra_op_parallelism_threads(1)
    x = tf.ones((4, 4))

    @tf.function
    def f(a):
        return a * 2.0 + 1.0

    def timed() -> float:
        f(x)
        t = time.perf_counter()
        for _ in range(calls):
            f(x)
        return (time.perf_counter() - t) / calls

    return interleaved(timed, tfdata, rounds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20_000)
    a = parser.parse_args()
    import stepscope

    with tempfile.TemporaryDirectory() as tmp:
        run = stepscope.start(dir=tmp, name="bench-compile", buffer_mb=64)
        try:
            rows = []
            try:
                base, extra = torch_rounds(a.rounds)
                rows.append(("torch.compile of a 4-layer MLP (aot_eager), compile and first run", f"{base:.3f} s",
                             f"{extra * 1e3:+.1f} ms ({100 * extra / base:+.1f}%)"))
            except ImportError:
                pass
            try:
                base, extra = tf_rounds(a.rounds, a.calls)
                rows.append(("a call of a traced tf.function", f"{base * 1e6:.1f} us", f"{extra * 1e6:+.2f} us"))
            except ImportError:
                pass
        finally:
            run.stop()
    print(f"median of {a.rounds} interleaved rounds")
    print("| what | plain | listening adds |")
    print("| --- | ---: | ---: |")
    for what, base, extra in rows:
        print(f"| {what} | {base} | {extra} |")


if __name__ == "__main__":
    main()
