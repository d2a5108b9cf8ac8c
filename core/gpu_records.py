"""Writes GPU activity records into the running trace, the way CUPTI's decoder
does in C++ (csrc/gpu.cc): for tests, fixtures and tools that replay GPU
activity without a GPU. Times are ``time.monotonic_ns()`` nanoseconds, the
clock trace files store.

Numbering follows CUPTI: copy kinds (``COPY_KINDS``), memory kinds
(``MEMORY_KINDS``) and synchronisation types (``SYNC_TYPES``).
"""

from __future__ import annotations

from stepscope.core import _native

KERNEL, MEMCPY, MEMSET, SYNC, RUNTIME, DRIVER = range(6)
COPY_KINDS = {"HtoD": 1, "DtoH": 2, "HtoA": 3, "AtoH": 4, "AtoA": 5, "AtoD": 6, "DtoA": 7, "DtoD": 8,
              "HtoH": 9, "PtoP": 10}
MEMORY_KINDS = {"unknown": 0, "pageable": 1, "pinned": 2, "device": 3, "array": 4, "managed": 5,
                "device_static": 6, "managed_static": 7}
SYNC_TYPES = {"unknown": 0, "event_synchronize": 1, "stream_wait_event": 2, "stream_synchronize": 3,
              "context_synchronize": 4}
CONTEXT_STREAM = 0xFFFFFFFF  # a sync record that is not about one stream


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
