"""Other tools' ranges as stepscope annotations.

Code already instrumented for another profiler (``torch.profiler.record_function``,
``torch.cuda.nvtx``, the ``nvtx`` package) shows up in the run without changes:
the integrations call these on the way through, after the tool's own call, so a
call that raises (torch's NVTX on a CPU build) records nothing and raises as
before. Nested ranges (push/pop, context managers) are per thread, as NVTX's
are; started ranges (start/end) are keyed by the id the tool returned and may end
on another thread.
"""

from __future__ import annotations

import threading

from stepscope.core.recording import ANNOTATION, annotation_begin, annotation_end, enabled, instant, intern


class _ThreadStacks(threading.local):
    def __init__(self):
        # this thread's open nested ranges, (key, handle); always present: the
        # native exit hook reads it on every step without raising AttributeError
        self.stack = []


class Ranges:
    def __init__(self):
        self.local = _ThreadStacks()
        self._started = {}

    def _stack(self) -> list:
        return self.local.stack

    def push(self, name, key=None) -> None:
        """Opens a nested range on this thread; key tells apart the stacks of NVTX
        domains, or the context manager that opened it."""
        self._stack().append((key, annotation_begin(_text(name), ANNOTATION)))

    def pop(self, key=None) -> None:
        """Closes this thread's innermost open range of key (none open: nothing)."""
        stack = self._stack()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == key:
                annotation_end(stack.pop(i)[1])
                return

    def start(self, name, range_id) -> None:
        if range_id is not None:
            self._started[_hashable(range_id)] = annotation_begin(_text(name), ANNOTATION)

    def end(self, range_id) -> None:
        handle = self._started.pop(_hashable(range_id), None) if range_id is not None else None
        if handle is not None:
            annotation_end(handle)

    @staticmethod
    def mark(name) -> None:
        if enabled():  # names are interned only while something records
            instant(ANNOTATION, intern(_text(name)))

    def clear(self) -> None:
        """Forgets open ranges (uninstrument; a forked child: its parent's ranges are not its own)."""
        self.local.stack = []  # this thread's (a forked child has only this one)
        self._started = {}


def call_then(original, record, fail):
    """A wrapper of one of the tool's functions: ``original(*args, **kwargs)`` first
    (it may raise: then nothing is recorded), then ``record(args, kwargs, result)``,
    whose failure turns the integration off (``fail``) and never reaches the job."""

    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            record(args, kwargs, result)
        except Exception as exc:  # noqa: BLE001 - never break the job
            fail(exc)
        return result

    return wrapper


def arg(args, kwargs, index: int, name: str, default=None):
    """A call's argument by position or keyword (None: the default)."""
    value = args[index] if len(args) > index else kwargs.get(name)
    return default if value is None else value


def _text(name) -> str:
    return name if type(name) is str else str(name)


def _hashable(range_id):
    try:
        hash(range_id)
        return range_id
    except TypeError:
        return id(range_id)
