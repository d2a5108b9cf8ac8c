"""System metrics: raw /proc counters on disk -> rates and percentages, long format.

The sampler stores raw counters (CPU jiffies, bytes, sectors, operations) as
counter events named ``<raw metric>|<device>``. Rates are computed here, from
consecutive samples of one series, so nothing depends on the sampling interval
and a counter reset (a worker that exited) is a gap, not a negative rate.

Columns: timestamp (UTC), timestamp_ns, node, process, metric, device, value, unit.
Node metrics (cpu_*, mem_*, disk_*, net_*, load1, gpu_* per device ``gpu<N>``, ...) come from the process
elected to sample its host; proc_* metrics belong to the process in the
``process`` column, device ``self`` or ``pid<N>`` for a child it started
(DataLoader workers). CPU, context switches, proc_cpu_percent and proc_rss come every sampling
interval; memory, disks, network, load and proc_* I/O once a second (csrc/record/sampler.cc says why).
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from stepscope.analysis.store.frames import as_strings
from stepscope.analysis.store.schema import SYSTEM_COLUMNS

COLUMNS = SYSTEM_COLUMNS
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# derived metric -> unit
UNITS = {
    "cpu_util": "%", "cpu_iowait": "%", "mem_used": "bytes", "mem_total": "bytes", "mem_used_percent": "%",
    "disk_read_bytes_per_s": "bytes/s", "disk_write_bytes_per_s": "bytes/s", "disk_iops": "1/s",
    "net_rx_bytes_per_s": "bytes/s", "net_tx_bytes_per_s": "bytes/s", "load1": "", "ctxt_per_s": "1/s",
    "procs_running": "", "proc_rss": "bytes", "proc_cpu_percent": "% of one core", "proc_threads": "",
    "proc_read_bytes_per_s": "bytes/s", "proc_write_bytes_per_s": "bytes/s",
    "proc_rchar_per_s": "bytes/s", "proc_wchar_per_s": "bytes/s",
    "gpu_util": "%", "gpu_memory_util": "%", "gpu_memory_used": "bytes", "gpu_memory_total": "bytes",
    "gpu_memory_used_percent": "%", "gpu_power": "W", "gpu_energy": "J", "gpu_temperature": "C",
    "gpu_sm_clock": "MHz", "gpu_throttle_reasons": "bitmask", "gpu_pcie_tx_bytes_per_s": "bytes/s",
    "gpu_pcie_rx_bytes_per_s": "bytes/s", "gpu_nvlink_tx_bytes_per_s": "bytes/s",
    "gpu_nvlink_rx_bytes_per_s": "bytes/s", "gpu_util_driver": "%",
}
# NVML readings (core/gpu_metrics.py): raw name -> (metric, scale)
GPU_GAUGES = {"gpu.util": ("gpu_util", 1), "gpu.mem_util": ("gpu_memory_util", 1),
              "gpu.mem_used": ("gpu_memory_used", 1), "gpu.mem_total": ("gpu_memory_total", 1),
              "gpu.power_mw": ("gpu_power", 1e-3), "gpu.energy_mj": ("gpu_energy", 1e-3),
              "gpu.temp": ("gpu_temperature", 1), "gpu.sm_clock": ("gpu_sm_clock", 1),
              "gpu.throttle": ("gpu_throttle_reasons", 1), "gpu.util_sample": ("gpu_util_driver", 1)}
GPU_COUNTERS = {"gpu.pcie_tx_bytes": ("gpu_pcie_tx_bytes_per_s", 1),
                "gpu.pcie_rx_bytes": ("gpu_pcie_rx_bytes_per_s", 1),
                "gpu.nvlink_tx_kib": ("gpu_nvlink_tx_bytes_per_s", 1024),
                "gpu.nvlink_rx_kib": ("gpu_nvlink_rx_bytes_per_s", 1024)}


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(COLUMNS, [
        "datetime64[ns, UTC]", "int64", "object", "object", "object", "object", "float64", "object"])})


def raw_samples(events: pd.DataFrame) -> pd.DataFrame:
    """The sampler's counters: process, node, raw metric, device, ts, value."""
    sel = events[(events["category"] == "system") & (events["kind"] == "counter")]
    if sel.empty:
        return pd.DataFrame(columns=["process", "node", "raw", "device", "ts", "value"])
    # "metric|device" names: each distinct name split once, not each sample's
    names = sel["name"].astype("category")
    split = [str(n).split("|", 1) for n in names.cat.categories]
    codes = names.cat.codes.to_numpy()
    return pd.DataFrame({
        "process": as_strings(sel["process"]),
        "node": as_strings(sel["host"]),
        "raw": np.array([p[0] for p in split] or [""], dtype=object)[codes],
        "device": np.array([p[1] if len(p) > 1 else "" for p in split] or [""], dtype=object)[codes],
        "ts": sel["start_ns"].to_numpy(),
        "value": sel["value"].to_numpy(),
    })


def _wide(raw: pd.DataFrame, prefix: str) -> pd.DataFrame:
    part = raw[raw["raw"].str.startswith(prefix)]
    if part.empty:
        return pd.DataFrame()
    wide = part.pivot_table(index=["node", "process", "device", "ts"], columns="raw", values="value",
                            aggfunc="last")
    return wide.sort_index()


def _rates(wide: pd.DataFrame):
    """Per-series differences and elapsed seconds (NaN on the first sample and on resets)."""
    d = wide.groupby(level=["node", "process", "device"]).diff()
    ts = wide.index.get_level_values("ts").to_numpy()
    dt = pd.Series(ts, index=wide.index).groupby(level=["node", "process", "device"]).diff() / 1e9
    d = d.where(d >= 0)
    return d, dt.where(dt > 0)


def _own_rates(wide: pd.DataFrame, columns: list):
    """``_rates`` of columns read on their own cadence (once a second beside others read every
    interval, the driver's own times): over the rows that hold them, on ``wide``'s rows."""
    d, dt = _rates(wide[columns].dropna())
    return d.reindex(wide.index), dt.reindex(wide.index)


def _long(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.reset_index()
    out = frame.melt(id_vars=["node", "process", "device", "ts"], var_name="metric", value_name="value")
    return out.dropna(subset=["value"])


def system_frame(events: pd.DataFrame) -> pd.DataFrame:
    raw = raw_samples(events)
    if raw.empty:
        return _empty()
    parts = []

    cpu = _wide(raw, "cpu.")
    if not cpu.empty:
        d, _ = _rates(cpu)
        total = d.sum(axis=1, min_count=3)
        parts.append(_long(pd.DataFrame({
            "cpu_util": 100 * d["cpu.busy"] / total,
            "cpu_iowait": 100 * d["cpu.iowait"] / total,
        }).where(total > 0)))

    mem = _wide(raw, "mem.")
    if not mem.empty and {"mem.total", "mem.available"} <= set(mem.columns):
        used = mem["mem.total"] - mem["mem.available"]
        parts.append(_long(pd.DataFrame({"mem_used": used, "mem_total": mem["mem.total"],
                                         "mem_used_percent": 100 * used / mem["mem.total"]})))

    disk = _wide(raw, "disk.")
    if not disk.empty:
        d, dt = _rates(disk)
        parts.append(_long(pd.DataFrame({
            "disk_read_bytes_per_s": d.get("disk.read_bytes") / dt,
            "disk_write_bytes_per_s": d.get("disk.write_bytes") / dt,
            "disk_iops": (d.get("disk.reads") + d.get("disk.writes")) / dt,
        })))

    net = _wide(raw, "net.")
    if not net.empty:
        d, dt = _rates(net)
        parts.append(_long(pd.DataFrame({"net_rx_bytes_per_s": d.get("net.rx_bytes") / dt,
                                         "net_tx_bytes_per_s": d.get("net.tx_bytes") / dt})))

    misc = _wide(raw[raw["raw"].isin(("load1", "ctxt", "procs_running"))], "")
    if not misc.empty:
        frame = pd.DataFrame(index=misc.index)
        if "load1" in misc:
            frame["load1"] = misc["load1"]
        if "procs_running" in misc:
            frame["procs_running"] = misc["procs_running"]
        if "ctxt" in misc:  # (every interval; the load average once a second)
            d, dt = _own_rates(misc, ["ctxt"])
            frame["ctxt_per_s"] = d["ctxt"] / dt
        parts.append(_long(frame))

    proc = _wide(raw, "proc.")
    if not proc.empty:
        frame = pd.DataFrame(index=proc.index)
        frame["proc_rss"] = proc.get("proc.rss")
        frame["proc_threads"] = proc.get("proc.threads")
        if {"proc.utime", "proc.stime"} <= set(proc.columns):  # (every interval; I/O bytes once a second)
            d, dt = _own_rates(proc, ["proc.utime", "proc.stime"])
            frame["proc_cpu_percent"] = 100 * (d["proc.utime"] + d["proc.stime"]) / CLOCK_TICKS / dt
        for src, dst in (("proc.read_bytes", "proc_read_bytes_per_s"), ("proc.write_bytes", "proc_write_bytes_per_s"),
                         ("proc.rchar", "proc_rchar_per_s"), ("proc.wchar", "proc_wchar_per_s")):
            if src in proc:
                d, dt = _own_rates(proc, [src])
                frame[dst] = d[src] / dt
        long = _long(frame)
        long["device"] = long["device"].replace("", "self")
        parts.append(long)

    gpu = _wide(raw, "gpu.")
    if not gpu.empty:
        parts.append(_gpu_metrics(gpu))

    if not parts:
        return _empty()
    out = pd.concat(parts, ignore_index=True)
    out["unit"] = out["metric"].map(UNITS).fillna("")
    out = out.rename(columns={"ts": "timestamp_ns"})
    out["timestamp_ns"] = out["timestamp_ns"].astype(np.int64)
    out["timestamp"] = pd.to_datetime(out["timestamp_ns"], unit="ns", utc=True)
    out = out.sort_values(["timestamp_ns", "metric", "device"], kind="stable").reset_index(drop=True)
    return out[COLUMNS]


def _gpu_metrics(wide: pd.DataFrame) -> pd.DataFrame:
    """NVML readings: gauges as they are (scaled to W, J), cumulative byte counters as
    rates. The driver's own samples have timestamps of their own, hence per-column work."""
    frame = pd.DataFrame(index=wide.index)
    for raw, (metric, scale) in GPU_GAUGES.items():
        if raw in wide:
            frame[metric] = wide[raw] * scale
    if {"gpu.mem_used", "gpu.mem_total"} <= set(wide.columns):
        frame["gpu_memory_used_percent"] = 100 * wide["gpu.mem_used"] / wide["gpu.mem_total"]
    for raw, (metric, scale) in GPU_COUNTERS.items():
        if raw in wide:
            d, dt = _own_rates(wide, [raw])
            frame[metric] = d[raw] * scale / dt
    return _long(frame)


def summarize_system(system: pd.DataFrame) -> dict:
    """The summary's system block: mean/p50/p95/max per headline metric (SPEC §6)."""
    def stats(metric, device=None, per_node_sum=False):
        s = system[system["metric"] == metric]
        if device is not None:
            s = s[s["device"] == device]
        if per_node_sum:  # e.g. network: all interfaces of a node at one instant
            s = s.groupby(["node", "timestamp_ns"], as_index=False)["value"].sum()
        v = s["value"].to_numpy(dtype=float)
        if len(v) == 0:
            return None
        return {"mean": round(float(v.mean()), 3), "p50": round(float(np.percentile(v, 50)), 3),
                "p95": round(float(np.percentile(v, 95)), 3), "max": round(float(v.max()), 3)}

    cpu = stats("cpu_util", "all")
    mem = stats("mem_used")
    gpu = stats("gpu_util")
    block = {
        "cpu_util_mean": cpu["mean"] if cpu else None,
        "memory_used_max_bytes": int(mem["max"]) if mem else None,
        "gpu_util_mean": gpu["mean"] if gpu else None,  # over every GPU of every node
        "gpu_util": gpu,
        "gpu_memory_util": stats("gpu_memory_util"),
        "cpu_util": cpu,
        "cpu_iowait": stats("cpu_iowait", "all"),
        "memory_used_percent": stats("mem_used_percent"),
        "net_rx_bytes_per_s": stats("net_rx_bytes_per_s", per_node_sum=True),
        "net_tx_bytes_per_s": stats("net_tx_bytes_per_s", per_node_sum=True),
        "disk_read_bytes_per_s": stats("disk_read_bytes_per_s", per_node_sum=True),
        "disk_write_bytes_per_s": stats("disk_write_bytes_per_s", per_node_sum=True),
    }
    return block
