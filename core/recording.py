"""The recording API: everything an integration needs from the core.

Integrations (stepscope's own and third-party ones) record through these
names and never import ``stepscope.core._native``; the native module stays
free to change behind them. Each name is the native function itself (no
Python frame in between: these run on the training loop's hot path).

Clock
    ``now()`` -> int: the run's clock, in ticks (monotonic; ``clock_info()``
    gives ``ticks_per_ns`` and the clock's source).

Names and categories
    ``intern(name)`` -> int: a name's id in this process's name table (a
    str; the table is bounded: past ``MAX_NAMES`` every new name shares one
    overflow id). Category ids: ``ANNOTATION``, ``PHASE``, ``STEP``, ``OP``,
    ``MODULE``, ``SYSTEM``, ``GPU``, ``COUNTER``, ``INTERNAL``,
    ``FRAMEWORK``, ``COMM``, or ``category(name)``.

Events (each does nothing while no session records; ``enabled()`` says)
    ``span(category, name_id, t0, t1=None, arg=None)``: a span from tick t0
    to t1 (None: now). ``instant(category, name_id, arg=None)``.
    ``counter(category, name_id, value, arg=None, at=None)``.

Annotations and phases
    ``annotate(name, category=ANNOTATION)``: a context manager or decorator;
    ``annotation_begin(name, category=ANNOTATION)`` -> handle and
    ``annotation_end(handle)`` for spans that begin and end in different
    callbacks; ``phase(name)`` for the canonical phases (``PHASES``).

Steps (SPEC §3; docs/design.md, "Where steps begin and end")
    ``begin_step(mode, at=0)`` -> the step's number, ``end_step(at=0,
    thread=0)``, ``interrupt_step(at=0)``, ``void_step(at=0)``, ``current_step()``;
    ``StepTracker``: the step state machine an integration subclasses
    (through ``stepscope.integrations._steps``).

Wrapping a framework's calls
    ``around(original, before, after, fail)``: a C wrapper that leaves no
    frame in tracebacks (``stepscope.integrations._frameless`` is its
    friendly front).
"""

from __future__ import annotations

from stepscope.core import _native
from stepscope.core.vocabulary import CATEGORIES

# --- clock ------------------------------------------------------------------------------
now = _native.now
clock_info = _native.clock_info
enabled = _native.enabled

# --- names and categories ----------------------------------------------------------------
intern = _native.intern
MAX_NAMES = _native.MAX_NAMES


def category(name: str) -> int:
    """The id of the event category ``name`` (one of ``CATEGORIES``)."""
    try:
        return CATEGORIES.index(name)
    except ValueError:
        raise ValueError(f"unknown event category {name!r}; known: {', '.join(CATEGORIES)}") from None


(ANNOTATION, PHASE, STEP, OP, MODULE, SYSTEM, GPU, COUNTER, INTERNAL, FRAMEWORK, COMM) = (
    category(name) for name in ("annotation", "phase", "step", "op", "module", "system", "gpu", "counter",
                                "internal", "framework", "comm"))

# --- events ------------------------------------------------------------------------------
span = _native.span
instant = _native.instant
counter = _native.counter
span_counted = _native.span_counted  # a span to now and a counter at its start, one call: returns now

# --- annotations and phases --------------------------------------------------------------
annotate = _native.annotate
annotation_begin = _native.annotation_begin
annotation_end = _native.annotation_end
Span = _native.Span
phase = _native.phase
PHASES = _native.PHASES

# --- steps -------------------------------------------------------------------------------
begin_step = _native.begin_step
end_step = _native.end_step
interrupt_step = _native.interrupt_step
void_step = _native.void_step
current_step = _native.current_step
StepTracker = _native.StepTracker

# --- wrapping ----------------------------------------------------------------------------
around = _native.around

__all__ = ["ANNOTATION", "COMM", "COUNTER", "FRAMEWORK", "GPU", "INTERNAL", "MAX_NAMES", "MODULE", "OP", "PHASE",
           "PHASES", "STEP", "SYSTEM", "Span", "annotate", "annotation_begin", "annotation_end", "around",
           "begin_step", "category", "clock_info", "counter", "current_step", "enabled", "end_step", "instant",
           "intern", "interrupt_step", "now", "phase", "span", "span_counted", "StepTracker", "void_step"]
