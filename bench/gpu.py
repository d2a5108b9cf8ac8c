"""GPU costs (needs an NVIDIA GPU and a CUDA build of torch; prints a skip line elsewhere).

    python3 bench/gpu.py [--steps 60]

1. One NVML sampling pass over every GPU (what the node sampler pays per tick).
2. A transformer-block training step (>= 20 ms) timed side by side in one
   process: no profiler, STEPSCOPE_GPU=metrics, STEPSCOPE_GPU=trace, and
   torch.profiler (CPU+CUDA activities), as ratios to no profiler.
3. Bytes on disk per kernel record in the trace run.
"""

import argparse
import os
import tempfile
import time

import stepscope
from stepscope.core import gpu as sgpu


def block_step(torch, model, opt, x):
    loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()


def timed(torch, model, opt, x, steps):
    for _ in range(5):
        block_step(torch, model, opt, x)
    t0 = time.perf_counter()
    for _ in range(steps):
        stepscope.step()
        block_step(torch, model, opt, x)
    return (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed")
        return
    if not sgpu.driver_present() or not torch.cuda.is_available():
        print("skipped: no NVIDIA GPU here")
        return
    print("device:", torch.cuda.get_device_name(0))
    from stepscope.core import gpu_metrics

    sampler, why = gpu_metrics.start(60000)
    if sampler is None:
        print("NVML pass: unavailable:", why)
    else:
        cost = gpu_metrics.pass_cost_s(sampler, 50)
        sampler.stop()
        print(f"NVML pass over {len(sampler.devices)} GPU(s): {cost * 1e3:.3f} ms "
              f"({100 * cost / 0.1:.2f}% of one core at 100 ms)")

    layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True).cuda()
    opt = torch.optim.AdamW(layer.parameters())
    x = torch.randn(32, 512, 1024, device="cuda")
    base = timed(torch, layer, opt, x, args.steps)
    print(f"no profiler: {base * 1e3:.2f} ms/step")
    d = tempfile.mkdtemp()
    for mode in ("metrics", "trace"):
        s = stepscope.start(dir=d, name=mode, gpu=mode)
        t = timed(torch, layer, opt, x, args.steps)
        s.stop()
        print(f"STEPSCOPE_GPU={mode}: {t * 1e3:.2f} ms/step, ratio {t / base:.4f}")
        if mode == "trace":
            trace = os.path.join(s.process_dir, "trace.ssc")
            n = len(stepscope.load(s.path).kernels)
            print(f"  {n} kernels; trace file {os.path.getsize(trace)} bytes "
                  f"(<= {os.path.getsize(trace) / max(n, 1):.1f} bytes per kernel, everything included)")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts):
        t = timed(torch, layer, opt, x, args.steps)
    print(f"torch.profiler: {t * 1e3:.2f} ms/step, ratio {t / base:.4f}")
    base2 = timed(torch, layer, opt, x, args.steps)
    print(f"no profiler again: {base2 * 1e3:.2f} ms/step, ratio {base2 / base:.4f} (the noise floor)")


if __name__ == "__main__":
    main()
