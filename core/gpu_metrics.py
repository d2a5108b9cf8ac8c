"""GPU metrics from NVML (nvidia-ml-py's ``pynvml``, imported only when used).

The host's elected node sampler runs one Python thread that reads every GPU
each ``interval_ms`` and records raw values as ``system`` counters named
``gpu.<metric>|gpu<N>`` (the convention of every system metric; rates and
units are made in analysis/tables/system.py). NVML calls are ctypes calls that drop
the GIL, so the training loop is not held up while the driver answers.

Per GPU and sample: utilization and memory-controller utilization (%), memory
used/total (bytes), power (mW), total energy (mJ, cumulative), temperature
(C), SM clock (MHz), clock-event (throttle) reasons (bitmask), PCIe TX/RX
bytes (cumulative field counters) and NVLink TX/RX (KiB, summed over links)
where the driver has them. ``nvmlDeviceGetSamples`` adds the driver's own
utilization samples taken between ours (``gpu.util_sample``, at their own
times). A reading the device does not support is skipped from then on.

Energy and the driver's samples are read once a second, not every pass: on an
H200 (driver 580) they cost 2.9 ms and 1.4 ms of CPU per call, every other
reading 0.16 ms together. Energy is a running total and the driver keeps its
samples, so nothing is lost but the energy curve's resolution.
"""

from __future__ import annotations

import threading
import time
from typing import List

from stepscope.core import _native
from stepscope.core.vocabulary import CATEGORIES

SYSTEM = CATEGORIES.index("system")
SLOW_READ_S = 1.0  # energy and the driver's samples: at most this often


def _load_nvml():
    """(pynvml, None) once NVML is initialised, or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML unavailable: {exc}"
    return pynvml, None


class _Device:
    def __init__(self, nvml, index: int):
        self.index = index
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.ids = {}
        self.unsupported = set()
        self.last_sample_us = time.time_ns() // 1000  # the driver's older samples predate the run
        self.slow_due = 0.0  # monotonic s: the next pass that reads energy and the driver's samples
        self.nvlinks = 0
        try:
            fv = nvml.nvmlDeviceGetFieldValues(self.handle, [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])[0]
            self.nvlinks = int(fv.value.uiVal) if fv.nvmlReturn == 0 else 0
        except Exception:  # noqa: BLE001
            self.nvlinks = 0

    def name_id(self, metric: str) -> int:
        i = self.ids.get(metric)
        if i is None:
            i = self.ids[metric] = _native.intern(f"gpu.{metric}|gpu{self.index}")
        return i


class NvmlSampler:
    """Samples every GPU of the host on a daemon thread until ``stop()``."""

    def __init__(self, nvml, interval_ms: int):
        self.nvml = nvml
        self.interval_s = interval_ms / 1000.0
        self.devices = [_Device(nvml, i) for i in range(nvml.nvmlDeviceGetCount())]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepscope-nvml", daemon=True)

    def start(self) -> "NvmlSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # noqa: BLE001 - a failing read must never reach the job
                pass
            next_at += self.interval_s
            now = time.monotonic()
            if next_at < now:  # fell behind: skip ticks rather than burst
                next_at = now + self.interval_s
            self._stop.wait(next_at - now)

    def sample_once(self) -> None:
        at = _native.now()
        for dev in self.devices:
            self._sample_device(dev, at)

    def _read(self, dev: _Device, key: str, fn, *args):
        if key in dev.unsupported:
            return None
        try:
            return fn(dev.handle, *args)
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) in (self.nvml.NVML_ERROR_NOT_SUPPORTED, self.nvml.NVML_ERROR_NO_PERMISSION):
                dev.unsupported.add(key)
            return None

    def _sample_device(self, dev: _Device, at: int) -> None:
        nv = self.nvml
        values = {}
        util = self._read(dev, "util", nv.nvmlDeviceGetUtilizationRates)
        if util is not None:
            values["util"], values["mem_util"] = util.gpu, util.memory
        mem = self._read(dev, "mem", nv.nvmlDeviceGetMemoryInfo)
        if mem is not None:
            values["mem_used"], values["mem_total"] = mem.used, mem.total
        values["power_mw"] = self._read(dev, "power_mw", nv.nvmlDeviceGetPowerUsage)
        now = time.monotonic()
        slow = now >= dev.slow_due
        if slow:
            dev.slow_due = now + SLOW_READ_S
            values["energy_mj"] = self._read(dev, "energy_mj", nv.nvmlDeviceGetTotalEnergyConsumption)
        values["temp"] = self._read(dev, "temp", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        values["sm_clock"] = self._read(dev, "sm_clock", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        values["throttle"] = self._read(dev, "throttle", reasons)
        fields = [(nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0), (nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0)]
        fields += [(f, link) for link in range(dev.nvlinks)
                   for f in (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)]
        got = self._read(dev, "fields", nv.nvmlDeviceGetFieldValues, fields)
        if got is not None:
            for key, fv in zip(("pcie_tx_bytes", "pcie_rx_bytes"), got[:2]):
                if fv.nvmlReturn == 0:
                    values[key] = fv.value.ullVal
            links = [fv for fv in got[2:] if fv.nvmlReturn == 0]
            if links:
                values["nvlink_tx_kib"] = sum(fv.value.ullVal for fv in links if fv.fieldId == fields[2][0])
                values["nvlink_rx_kib"] = sum(fv.value.ullVal for fv in links if fv.fieldId == fields[3][0])
        for metric, value in values.items():
            if value is not None:
                _native.counter(SYSTEM, dev.name_id(metric), float(value), None, at)
        if slow:
            self._driver_samples(dev, at)

    def _driver_samples(self, dev: _Device, at: int) -> None:
        """The driver's own utilization samples since the last pass, each at its time
        (NVML stamps them in wall-clock microseconds)."""
        got = self._read(dev, "samples", self.nvml.nvmlDeviceGetSamples, self.nvml.NVML_GPU_UTILIZATION_SAMPLES,
                         dev.last_sample_us)
        if not got:
            return
        _, samples = got
        if not samples:
            return
        ticks_per_ns = _native.clock_info()["ticks_per_ns"]
        now_ns = time.time_ns()
        name = dev.name_id("util_sample")
        for s in samples:
            if s.timeStamp <= dev.last_sample_us:
                continue
            age_ns = max(0, now_ns - s.timeStamp * 1000)
            _native.counter(SYSTEM, name, float(s.sampleValue.uiVal), None, max(1, at - int(age_ns * ticks_per_ns)))
        dev.last_sample_us = max(s.timeStamp for s in samples)


def start(interval_ms: int) -> tuple:
    """(sampler or None, note or None). Never raises."""
    nvml, why = _load_nvml()
    if nvml is None:
        return None, why
    try:
        sampler = NvmlSampler(nvml, interval_ms)
        if not sampler.devices:
            nvml.nvmlShutdown()
            return None, "NVML reports no GPU"
        return sampler.start(), None
    except Exception as exc:  # noqa: BLE001
        return None, f"NVML failed: {type(exc).__name__}: {exc}"


def pass_cost_s(sampler: NvmlSampler, passes: int = 50) -> float:
    """Benchmark: seconds per sampling pass over all GPUs (run on a GPU machine)."""
    t0 = time.perf_counter()
    for _ in range(passes):
        sampler.sample_once()
    return (time.perf_counter() - t0) / passes


__all__: List[str] = ["NvmlSampler", "start", "pass_cost_s"]
