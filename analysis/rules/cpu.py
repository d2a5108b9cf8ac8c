"""CPUBottleneck: a GPU idles while the host CPU is saturated."""

from __future__ import annotations

from stepscope.analysis.rules.advice import advice
from stepscope.analysis.rules.utilization import LowGPUCause
from stepscope.analysis.rules.windows import COMMON, CPU_BUSY


class CPUBottleneck(LowGPUCause):
    name = "CPUBottleneck"
    summary = ("A GPU is below the utilization threshold while the host CPU is busy: all cores together, or the "
               "training process itself, at the CPU threshold. A single busy core among idle ones does not count "
               "(SageMaker Debugger fired on any one core).")
    params = {**COMMON, "cpu_threshold": CPU_BUSY}
    cause = "cpu"
    needs = {"cpu_util": "host CPU"}

    def describe(self, where, share, m, p, framework):
        cpu_all, own = m.get("cpu_util", float("nan")), m.get("process_cpu", float("nan"))
        if own == own and own >= p["cpu_threshold"] and not cpu_all >= p["cpu_threshold"]:
            what = (f"the training process is at {own:.0f}% of a core (all cores: {cpu_all:.0f}%), so its own "
                    "Python thread is the bottleneck")
            fix = advice("offload", framework)
        else:
            what = f"all CPU cores are {cpu_all:.0f}% busy"
            fix = advice("cheaper_cpu", framework)
        message = (f"{where} is held back by the host CPU: {m['gpu_util']:.0f}% GPU utilization while {what}, "
                   f"for {100 * share:.0f}% of the training loop")
        return message, fix
