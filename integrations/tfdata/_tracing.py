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

What a trace leaves out is paid at the function's first run: the runtime instantiates
and optimizes the graph there, and XLA compiles it (``jit_compile=True``, Keras's
default on GPUs). ``AtomicFunction.call_flat`` is wrapped: the first two eager runs of
each built function are ``TF_RUN_PREFIX`` spans; analysis takes the first's extra time
over the second as that cost (docs/design.md, "Compilation"). Every later call costs a
dictionary look-up.
"""

from __future__ import annotations

import re
import weakref

from stepscope.core.recording import FRAMEWORK, enabled, intern, now, span
from stepscope.core.vocabulary import TF_RUN_PREFIX, TRACE_PREFIX
from stepscope.integrations._frameless import frameless

MAX_FUNCTIONS = 1024  # Python functions whose last signature is kept (a program making functions in a loop)
MAX_RUN_FUNCTIONS = 4096  # built functions whose first runs are recorded (later ones are not)
MAX_CHILDREN = 256  # functions a function calls, looked at for XLA
XLA_ATTR = "_XlaMustCompile"
_BUILT_NAME = re.compile(r"^__(?:inference|forward|backward)_(?P<function>.+?)_(?P<id>\d+)$")


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


class FirstRuns:
    """The first two eager runs of each function TensorFlow built (the module's docstring)."""

    def __init__(self, executing_eagerly):
        self.runs = {}  # the built function's name (bytes) -> its runs so far (1, 2)
        self.executing_eagerly = executing_eagerly

    def wrap(self, original):
        """Frameless: an error the function raises keeps its traceback as without stepscope."""
        runs, eager = self.runs, self.executing_eagerly

        def before(function, /, *args, **kwargs):
            name = function.name
            n = runs.get(name, 0)
            if n >= 2 or not enabled() or not eager() or (not n and len(runs) >= MAX_RUN_FUNCTIONS):
                return None
            runs[name] = n + 1
            return (function, *args), kwargs, (function, name, n + 1, now())

        def after(token, exc):
            if exc is None:
                function, name, n, t0 = token
                t1 = now()
                span(FRAMEWORK, intern(f"{TF_RUN_PREFIX} {_display(name)}#{n}" + (" xla" if _xla(function) else "")),
                     t0, t1)

        return frameless(original, before, after, "recording tf.function's first runs failed")


def _display(name: bytes) -> str:
    """``function/id`` of a built function's name (``__inference_train_step_123``)."""
    text = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
    m = _BUILT_NAME.match(text)
    return f"{m['function']}/{m['id']}" if m else f"{text}/0"


def _xla(function) -> bool:
    """Whether the function, or one it calls, must compile with XLA."""
    try:
        found = [function, *list(getattr(function, "children", []))[:MAX_CHILDREN]]
        for f in found:
            attr = f.cached_definition.attr.get(XLA_ATTR)
            if attr is not None and attr.b:
                return True
    except Exception:  # noqa: BLE001 - another TensorFlow's function: not known to be XLA
        return False
    return False


def install(instrumentor) -> None:
    try:
        from tensorflow.python.eager import context
        from tensorflow.python.eager.polymorphic_function import atomic_function, tracing_compilation
    except ImportError:
        return  # another TensorFlow: traces not recorded
    if callable(getattr(tracing_compilation, "_create_concrete_function", None)):
        instrumentor.patch(tracing_compilation, "_create_concrete_function", Traces().wrap)
    atomic = getattr(atomic_function, "AtomicFunction", None)
    if callable(getattr(atomic, "call_flat", None)) and callable(getattr(context, "executing_eagerly", None)):
        instrumentor.patch(atomic, "call_flat", FirstRuns(context.executing_eagerly).wrap)
