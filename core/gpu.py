"""GPU support for a session: NVML metrics (gpu_metrics.py) and CUPTI activity
tracing (csrc/record/cupti.cc), as ``STEPSCOPE_GPU`` asks:

* ``off``: neither.
* ``metrics``: NVML metrics, sampled by the host's elected node sampler.
* ``trace``: metrics, and every rank traces its own GPU activity with CUPTI.
* ``auto`` (default): as ``trace`` where an NVIDIA driver is installed;
  elsewhere nothing is tried.

Whatever cannot be measured becomes exactly one note (``GPU: ...``) in
``run.json``; nothing here raises. CUPTI refusing to trace on a machine that
has a GPU (missing privileges, another profiler owning CUPTI) also prints one
loud line on stderr with the fix: a profile must never be silently CPU-only.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys
import time
from typing import List, Optional

from stepscope.core import _native, gpu_metrics, runinfo
from stepscope.core.vocabulary import RUN_JSON

_metrics: Optional[gpu_metrics.NvmlSampler] = None
_tracing = False
_run_json: Optional[str] = None
_paused_at: Optional[float] = None


def driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def find_cupti() -> List[str]:
    """Candidates for libcupti, best first: a copy already loaded in this process,
    the one from torch's ``nvidia-*`` wheels (what torch itself loads), then the
    CUDA toolkit's, then the loader's search path."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            found += [line.split()[-1] for line in f if "libcupti.so" in line]
    except OSError:
        pass
    try:
        spec = importlib.util.find_spec("nvidia")  # a namespace package: nothing is imported
        roots = list(spec.submodule_search_locations or []) if spec else []
    except (ImportError, ValueError):
        roots = []
    for root in roots:
        found += sorted(glob.glob(os.path.join(root, "cu*", "lib", "libcupti.so*")), reverse=True)
        found += sorted(glob.glob(os.path.join(root, "cuda_cupti", "lib", "libcupti.so*")), reverse=True)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
                 *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)):
        if home:
            for sub in ("extras/CUPTI/lib64", "lib64", "lib"):
                found += sorted(glob.glob(os.path.join(home, sub, "libcupti.so*")), reverse=True)
    found += ["libcupti.so.13", "libcupti.so.12", "libcupti.so"]
    return list(dict.fromkeys(found))


def start(config, node: bool, main: bool, run_dir: str) -> List[str]:
    """Starts what config.gpu asks for; returns the notes (at most one)."""
    global _metrics, _tracing, _run_json
    mode = config.gpu
    if mode == "off" or not (node or main):
        return []
    _run_json = os.path.join(run_dir, RUN_JSON)
    if mode == "auto" and not driver_present():
        return ["GPU: no NVIDIA driver here (libcuda.so.1 not found); GPU metrics and activity are not recorded"]
    problems = []
    if node:
        _metrics, why = gpu_metrics.start(config.interval_ms)
        if why:
            problems.append(f"metrics off ({why})")
    if mode in ("trace", "auto") and main:
        ok, no_device, message = _start_tracing()
        _tracing = ok
        if not ok:
            problems.append(f"activity tracing off ({message})")
            if not no_device:
                sys.stderr.write(f"stepscope: GPU activity is NOT traced, the profile has no kernels: {message}\n")
                sys.stderr.flush()
        else:
            if config.steps is not None:  # STEPSCOPE_STEPS bounds the tracing cost
                _native.cupti_set_steps(*config.steps)
    return ["GPU: " + "; ".join(problems)] if problems else []


def _start_tracing():
    last = (False, True, "libcupti not found")
    for library in find_cupti():
        last = _native.cupti_start(library)
        if last[0] or "cannot load" not in last[2]:
            return last
    return last


def stop() -> None:
    """Flushes CUPTI's pending buffers into the trace and stops the metrics thread."""
    global _metrics, _tracing
    if _tracing:
        _tracing = False
        try:
            _native.cupti_stop()
        except Exception:  # noqa: BLE001
            pass
    if _metrics is not None:
        _metrics.stop()
        _metrics = None


# --- one owner of CUPTI's activity buffers per process ------------------------------
def pause_activity_tracing() -> None:
    """Flushes and stands aside while another profiler (torch.profiler) owns CUPTI;
    the framework integration that sees that profiler start calls it."""
    global _paused_at
    if _tracing and _paused_at is None and _native.cupti_pause():
        _paused_at = time.time()


def activity_tracing() -> bool:
    """Whether stepscope's CUPTI activity tracing runs now."""
    return bool(_tracing) and _paused_at is None


def resume_activity_tracing(owner: str = "another profiler", reason: Optional[str] = None,
                            record_note: bool = True) -> None:
    """Takes CUPTI back and notes the gap in run.json (``reason``: why it was paused, when
    not for another profiler; ``record_note=False``: a gap the run explains itself, an operator
    window's)."""
    global _paused_at, _tracing
    if _paused_at is None:
        return
    began, _paused_at = _paused_at, None
    err = _native.cupti_resume()
    why = reason or f"while {owner} owned CUPTI"
    note = (f"GPU: activity tracing paused from {began:.3f} to {time.time():.3f} (epoch s) {why}"
            + (f"; not resumed: {err}" if err else ""))
    if err:
        _tracing = False
    if _run_json and (record_note or err):
        try:
            runinfo.update_json_locked(_run_json, lambda info: info.setdefault("notes", []).append(note))
        except Exception:  # noqa: BLE001
            pass


def _after_fork_in_child() -> None:
    # A forked child inherits neither CUPTI's state nor the NVML thread.
    global _metrics, _tracing, _paused_at
    _metrics, _tracing, _paused_at = None, False, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
