"""Writes GPU activity records into the running trace, the way CUPTI's decoder
does in C++ (csrc/record/gpu.cc): for tests, fixtures and tools that replay GPU
activity without a GPU. Times are ``time.monotonic_ns()`` nanoseconds, the
clock trace files store.

Numbering follows CUPTI: copy kinds (``COPY_KINDS``), memory kinds
(``MEMORY_KINDS``) and synchronisation types (``SYNC_TYPES``).
"""

from __future__ import annotations

from stepscope.core import _native
from stepscope.core import vocabulary as _v
from stepscope.core.vocabulary import CONTEXT_STREAM  # a sync record not about one stream

KERNEL, MEMCPY, MEMSET, SYNC, RUNTIME, DRIVER = (_v.GPU_TYPES.index(t) for t in
                                                 ("kernel", "memcpy", "memset", "sync", "runtime", "driver"))
# name -> CUPTI number
COPY_KINDS = {name: i for i, name in enumerate(_v.COPY_KINDS) if name != "unknown"}
MEMORY_KINDS = {name: i for i, name in enumerate(_v.MEMORY_KINDS)}
SYNC_TYPES = {name: i for i, name in enumerate(_v.SYNC_TYPES)}


def kernel(name: str, start_ns: int, end_ns: int, correlation: int, *, device: int = 0, stream: int = 7,
           grid=(1, 1, 1), block=(1, 1, 1), registers: int = 0, static_smem: int = 0,
           dynamic_smem: int = 0) -> bool:
    cfg = _native.launch_config(tuple(grid), tuple(block), registers, static_smem, dynamic_smem)
    return _native.gpu_record(KERNEL, start_ns, end_ns, correlation, device, stream, _native.intern(name),
                              config=cfg)


def memcpy(kind: str, nbytes: int, start_ns: int, end_ns: int, correlation: int, *, device: int = 0,
           stream: int = 7, src: str = "pageable", dst: str = "device") -> bool:
    return _native.gpu_record(MEMCPY, start_ns, end_ns, correlation, device, stream, sub=COPY_KINDS[kind],
                              sub2=MEMORY_KINDS[src] | MEMORY_KINDS[dst] << 4, bytes=nbytes)


def memset(nbytes: int, start_ns: int, end_ns: int, correlation: int, *, device: int = 0, stream: int = 7,
           memory: str = "device") -> bool:
    return _native.gpu_record(MEMSET, start_ns, end_ns, correlation, device, stream, sub=MEMORY_KINDS[memory],
                              bytes=nbytes)


def sync(kind: str, start_ns: int, end_ns: int, correlation: int, *, device: int = 0,
         stream: int = CONTEXT_STREAM) -> bool:
    return _native.gpu_record(SYNC, start_ns, end_ns, correlation, device, stream, sub=SYNC_TYPES[kind])


def api(name: str, start_ns: int, end_ns: int, correlation: int, *, thread: int = 0, driver: bool = False) -> bool:
    """A CUDA runtime (or driver) API call on the host, e.g. ``cudaLaunchKernel``."""
    return _native.gpu_record(DRIVER if driver else RUNTIME, start_ns, end_ns, correlation,
                              name=_native.intern(name), thread=thread)
