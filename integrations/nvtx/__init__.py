"""The ``nvtx`` package's ranges, recorded as stepscope annotations.

Code annotated for Nsight (``@nvtx.annotate()``, ``with nvtx.annotate("x")``,
``nvtx.push_range``/``pop_range``, ``start_range``/``end_range``, ``mark``) shows
up in the run unchanged. Without an NVTX tool attached the package turns every
call into a no-op before it reaches the NVTX library, so the patches sit at its
Python API, not at the library calls:

* ``annotate.__enter__``/``__exit__`` (the context manager), and
  ``annotate.__call__`` (the decorator: the function it returns is timed too;
  it already is a wrapper when a tool is attached);
* the module functions, under both names (``nvtx.push_range`` and
  ``nvtx.nvtx.push_range``).

Nested ranges are per thread and per domain, as NVTX's. Process ranges
(``start_range``) are recorded only when a tool gives them an id: without one
the package returns None for every range and they cannot be told apart. With
``NVTX_DISABLE`` set the package drops the messages, and nothing is recorded.
The ``Domain`` object API (Cython methods) is not patched.
"""

from __future__ import annotations

import functools
import os

from stepscope.integrations._base import Instrumentor
from stepscope.integrations._ranges import Ranges, arg, call_then

__all__ = ["instrumentor", "instrument", "uninstrument"]

FUNCTIONS = ("push_range", "pop_range", "start_range", "end_range", "mark")


class NvtxInstrumentor(Instrumentor):
    name = "nvtx"
    module = "nvtx"
    distribution = "nvtx"
    supported = ">=0.2"

    def __init__(self):
        super().__init__()
        self.ranges = Ranges()
        self.fork_hook = False

    def _instrument(self) -> None:
        import nvtx
        from nvtx import nvtx as api

        if not api.enabled():
            return  # NVTX_DISABLE: the package's stand-ins keep no message
        if hasattr(os, "register_at_fork") and not self.fork_hook:  # cannot be unregistered: once
            os.register_at_fork(after_in_child=self.ranges.clear)  # a child inherits no open range
            self.fork_hook = True
        cls = api.annotate
        self.patch(cls, "__enter__", self._enter)
        self.patch(cls, "__exit__", self._exit)
        self.patch(cls, "__call__", self._decorate)
        for owner in {id(nvtx): nvtx, id(api): api}.values():
            for name in FUNCTIONS:
                if callable(getattr(owner, name, None)):
                    self.patch(owner, name, getattr(self, "_" + name))

    def _uninstrument(self) -> None:
        self.ranges.clear()

    # --- annotate ------------------------------------------------------------------------
    def _enter(self, original):
        ranges, fail = self.ranges, self.fail

        def __enter__(annotation):
            result = original(annotation)
            try:
                ranges.push(_message(annotation, "annotate"), id(annotation))
            except Exception as exc:  # noqa: BLE001 - never break the job
                fail(exc)
            return result

        return __enter__

    def _exit(self, original):
        ranges, fail = self.ranges, self.fail

        def __exit__(annotation, *exc_info):
            try:
                ranges.pop(id(annotation))
            except Exception as exc:  # noqa: BLE001
                fail(exc)
            return original(annotation, *exc_info)

        return __exit__

    def _decorate(self, original):
        ranges, fail = self.ranges, self.fail

        def __call__(annotation, func):
            decorated = original(annotation, func)
            try:
                name = _message(annotation, None) or getattr(func, "__qualname__", None) or func.__name__
            except Exception:  # noqa: BLE001 - not a function: the package's own result
                return decorated

            @functools.wraps(decorated)
            def timed(*args, **kwargs):
                key = object()
                try:
                    ranges.push(name, key)
                except Exception as exc:  # noqa: BLE001
                    fail(exc)
                try:
                    return decorated(*args, **kwargs)
                finally:
                    try:
                        ranges.pop(key)
                    except Exception as exc:  # noqa: BLE001
                        fail(exc)

            return timed

        return __call__

    # --- module functions (their signatures: message, color, domain, category, payload) -----
    def _push_range(self, original):
        return call_then(original, lambda a, k, _: self.ranges.push(
            arg(a, k, 0, "message", "push_range"), ("nvtx", arg(a, k, 2, "domain"))), self.fail)

    def _pop_range(self, original):
        return call_then(original, lambda a, k, _: self.ranges.pop(("nvtx", arg(a, k, 0, "domain"))), self.fail)

    def _start_range(self, original):
        return call_then(original, lambda a, k, range_id: self.ranges.start(
            arg(a, k, 0, "message", "start_range"), range_id), self.fail)

    def _end_range(self, original):
        return call_then(original, lambda a, k, _: self.ranges.end(arg(a, k, 0, "range_id")), self.fail)

    def _mark(self, original):
        return call_then(original, lambda a, k, _: self.ranges.mark(arg(a, k, 0, "message", "mark")), self.fail)


def _message(annotation, default):
    """annotate's message (kept in init_args whether or not a tool is attached)."""
    args = getattr(annotation, "init_args", None)
    message = args[0] if args else None
    return message if message is not None else default


instrumentor = NvtxInstrumentor()


def instrument() -> bool:
    """Records the ``nvtx`` package's ranges (zero-edit mode does this when ``nvtx`` is imported)."""
    return instrumentor.instrument(stacklevel=3)


def uninstrument() -> None:
    instrumentor.uninstrument()
