"""tf.function's traces (issue 59): every time TensorFlow traces a function into a new
graph, zero edits, with how long it took and why it traced again.

TensorFlow builds a graph where its function cache misses, in
``tracing_compilation._create_concrete_function`` (called by module lookup, once per
trace): that one function is wrapped. Each trace is a ``framework`` span named
``TRACE_PREFIX <function>#<n>: <cause>`` on the thread that traced (n: its trace number
of that Python function, from 1). The cause of a retrace compares the new signature
with the function's previous one: ``python value`` (an argument that is a Python
number or object took another value: each one is a new graph), ``shape`` (a tensor of
another shape), else ``signature``.
"""

from __future__ import annotations

import weakref

from stepscope.core.recording import FRAMEWORK, enabled, intern, now, span
from stepscope.core.vocabulary import TRACE_PREFIX
from stepscope.integrations._frameless import frameless

MAX_FUNCTIONS = 1024  # Python functions whose last signature is kept (a program making functions in a loop)


def _constraints(function_type) -> dict:
    try:
        return {name: p.type_constraint for name, p in function_type.parameters.items()}
    except Exception:  # noqa: BLE001 - another TensorFlow's function type
        return {}


def cause(before: dict, after: dict) -> str:
    for name, now_type in after.items():
        then = before.get(name)
        if then is None or then == now_type:
            continue
        kind = type(now_type).__name__
        if "Literal" in kind or "Literal" in type(then).__name__:
            return "python value"
        if hasattr(now_type, "shape") or "Tensor" in kind:
            return "shape"
    return "signature"


class Traces:
    def __init__(self):
        self.last = {}  # id(python function) -> (weak reference or None, trace count, its constraints)

    def wrap(self, original):
        """Frameless (a tracing error, the user's model code, keeps its traceback as without
        stepscope): each trace that returned is recorded."""
        last = self.last

        def before(function_type, type_context, func_graph, tracing_options, *args, **kwargs):
            if not enabled():
                return None
            return (function_type, type_context, func_graph, tracing_options, *args), kwargs, \
                (tracing_options, function_type, now())

        def after(token, exc):
            if exc is None:
                self.record(*token, last)

        return frameless(original, before, after, "recording tf.function's traces failed")

    def record(self, options, function_type, t0, last) -> None:
        fn = getattr(options, "python_function", None)
        name = str(getattr(options, "name", None) or getattr(fn, "__name__", "function"))
        constraints = _constraints(function_type)
        key = id(fn)
        found = last.get(key)
        if found is not None and found[0] is not None and found[0]() is not fn:
            found = None  # (an id reused by another function)
        n = 1 if found is None else found[1] + 1
        why = "first" if found is None else cause(found[2], constraints)
        if len(last) >= MAX_FUNCTIONS:
            last.clear()
        try:
            ref = weakref.ref(fn)
        except TypeError:
            ref = None
        last[key] = (ref, n, constraints)
        span(FRAMEWORK, intern(f"{TRACE_PREFIX} {name}#{n}: {why}"), t0, now())


def install(instrumentor) -> None:
    try:
        from tensorflow.python.eager.polymorphic_function import tracing_compilation
    except ImportError:
        return  # another TensorFlow: traces not recorded
    if callable(getattr(tracing_compilation, "_create_concrete_function", None)):
        instrumentor.patch(tracing_compilation, "_create_concrete_function", Traces().wrap)
