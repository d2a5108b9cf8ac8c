"""IOBottleneck: a GPU idles while the host waits on storage."""

from __future__ import annotations

from stepscope.analysis.rules.advice import advice
from stepscope.analysis.rules.utilization import LowGPUCause
from stepscope.analysis.rules.windows import COMMON, IOWAIT_RATIO, MIN_IOWAIT


class IOBottleneck(LowGPUCause):
    name = "IOBottleneck"
    summary = "A GPU is below the utilization threshold while the host's CPUs wait for I/O more than they work."
    params = {**COMMON, "iowait_ratio": IOWAIT_RATIO, "min_iowait": MIN_IOWAIT}
    cause = "io"
    needs = {"cpu_iowait": "host CPU iowait"}

    def describe(self, where, share, m, p, framework):
        disk = m.get("disk_read_bytes_per_s")
        reads = f", disks reading {disk / (1 << 20):.0f} MB/s" if disk is not None else ""
        message = (f"{where} waits on storage: {m['gpu_util']:.0f}% GPU utilization while the CPUs spend "
                   f"{m['cpu_iowait']:.0f}% of their time in I/O wait against {m['cpu_util']:.0f}% busy{reads}, "
                   f"for {100 * share:.0f}% of the training loop")
        recommendation = ("Reading the data is the bottleneck: stage the data set on local NVMe (or in memory), "
                          "read fewer larger files (sharded formats such as WebDataset, TFRecord, Parquet, "
                          f"MosaicML streaming) instead of many small ones, {advice('overlap_reads', framework)}.")
        return message, recommendation
