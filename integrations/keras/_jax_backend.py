"""Keras on JAX (issue 63, first part): the step function timed, and its fetch.

Keras's JAX trainer hands its step function the epoch's iterator; the function takes
its batch with ``next(iterator)`` before running the jitted step. The callback gives the
function a thin iterator that times that fetch (GetNext, inside the step the batch
callback began), and learns where each step's work ended and which call met the end of
the data (no step: SPEC §3), as on TensorFlow. The compute phases inside the jitted
step are not measured on this backend: a note says so (``NOTE``).

JAX's compiles come from its public monitoring API (``jax.monitoring``): each stage of
a compile (tracing to a jaxpr, lowering to MLIR, the backend's compile) reports its
duration and function as it ends, and becomes a ``framework`` span
``JAX_COMPILE_PREFIX <function>: <stage>`` ending there (analysis/compilation.py).
"""

from __future__ import annotations

from stepscope.core.recording import FRAMEWORK, PHASE, clock_info, enabled, intern, now, span
from stepscope.core.vocabulary import JAX_COMPILE_PREFIX
from stepscope.integrations._frameless import frameless
from stepscope.integrations._steps import GETNEXT

NOTE = ("Keras on JAX: steps and GetNext are recorded; the compute phases inside the jitted step (Forward, Loss, "
        "Backward, Optimizer) are not measured on this backend: their time is in Other")


class _TimedIterator:
    """The epoch's iterator, each ``next`` a GetNext span."""

    __slots__ = ("_it",)

    def __init__(self, iterator):
        self._it = iterator

    def __iter__(self):
        return self

    def __next__(self):
        t0 = now()
        batch = next(self._it)
        span(PHASE, GETNEXT, t0, now())
        return batch


def _step_function(function, callback):
    """Keras's JAX step function ``(state, iterator)``, timed; frameless."""
    def before(state, iterator, *rest, **kwargs):
        return (state, _TimedIterator(iterator), *rest), kwargs, callback

    def after(callback, exc):
        if exc is None:
            callback._work_end = now()
        elif isinstance(exc, StopIteration):  # the data's end: the call belongs to no step
            callback._data_ended()
        else:
            callback._work_end = now()
            callback._step_failed()

    return frameless(function, before, after, "the Keras integration failed")


_STAGES = {"/jax/core/compile/jaxpr_trace_duration": "trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
           "/jax/core/compile/backend_compile_duration": "compile"}
_LISTENING = []  # the listener, once a process (jax.monitoring keeps it; it records only while a session does)


def listen_to_compiles() -> None:
    if _LISTENING:
        return
    import jax.monitoring

    ticks_per_ns = float(clock_info().get("ticks_per_ns", 1.0) or 1.0)

    def compiled(event, seconds, **kwargs):
        stage = _STAGES.get(event)
        if stage is None or not enabled():
            return
        try:
            end = now()
            name = f"{JAX_COMPILE_PREFIX} {kwargs.get('fun_name') or 'function'}: {stage}"
            span(FRAMEWORK, intern(name), max(end - int(seconds * 1e9 * ticks_per_ns), 0), end)
        except Exception:  # noqa: BLE001 - JAX's compile goes on
            pass

    jax.monitoring.register_event_duration_secs_listener(compiled)
    _LISTENING.append(compiled)
