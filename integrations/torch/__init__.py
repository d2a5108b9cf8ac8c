"""PyTorch: phases and steps from global hooks, with no edits to the script.

    stepscope.integrations.torch.instrument()        # uninstrument() undoes it

What is patched, and why each patch is safe, is in ``_instrumentor.py`` (the
phases) and ``_roots.py`` (timing models without leaving anything on them).

Seams for integrations that build on this one (Lightning, Keras on the torch
backend); they never touch this module's private state:

* ``step_tracker()``   the calling thread's step tracker (``integrations._steps``)
* ``forced_mode(m)``   a context in which every step is of mode ``m``
* ``hidden()``         a context whose work makes no steps and no phases
* ``timed_fetches(it)`` an iterator over ``it`` whose every ``next`` is one
                       fetch (GetNext): for loaders that wrap a DataLoader and
                       read ahead of the loop (Accelerate's)
"""

from __future__ import annotations

import contextlib
from typing import Optional

from stepscope.core.recording import now
from stepscope.integrations._steps import StepTracker
from stepscope.integrations.torch import _fetch
from stepscope.integrations.torch._instrumentor import TorchInstrumentor

__all__ = ["instrument", "uninstrument", "is_instrumented", "instrumentor", "step_tracker", "forced_mode",
           "hidden", "is_hidden", "timed_fetches"]

instrumentor = TorchInstrumentor()


def instrument(model=None, optimizer=None) -> bool:
    """Hooks PyTorch (SPEC §1); True when instrumented. A second call warns and
    does nothing.

    model: time only this module's forward (no global discovery hooks).
    optimizer: record only this optimizer's steps.
    Imports torch: call it when torch is in use.
    """
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError("stepscope.integrations.torch needs PyTorch: pip install torch") from exc
    return instrumentor.instrument(model=model, optimizer=optimizer, stacklevel=3)


def uninstrument() -> None:
    """Removes every hook and patch instrument() installed."""
    instrumentor.uninstrument()


def is_instrumented() -> bool:
    return instrumentor.is_instrumented()


def step_tracker() -> Optional[StepTracker]:
    """The calling thread's step tracker (steps belong to the thread running the loop),
    instrumenting torch first if needed (None if that failed)."""
    return instrumentor.tracker if instrumentor.ensure() else None


@contextlib.contextmanager
def forced_mode(mode: str):
    """Steps begun inside are of ``mode`` ("train", "eval", "predict"): for a
    framework loop that knows its mode. Closes the open step on entry and exit."""
    on = instrumentor.ensure()
    if on:
        loop = instrumentor.loop
        loop.tracker.close()
        loop.forced_modes.append(mode)
        instrumentor.roots.look_again()
    try:
        yield
    finally:
        if on and instrumentor.is_instrumented():
            loop = instrumentor.loop
            loop.tracker.close()
            if loop.forced_modes:
                loop.forced_modes.pop()


@contextlib.contextmanager
def hidden():
    """Work inside makes no steps and no phases (symbolic builds, a framework's
    own bookkeeping): it runs as if nested in a forward."""
    on = instrumentor.is_instrumented()
    if on:
        loop = instrumentor.loop
        loop.depth += 1
    try:
        yield
    finally:
        if on and instrumentor.is_instrumented():
            loop.depth = max(0, loop.depth - 1)


def loop_ended(at: int = 0) -> None:
    """A framework's loop (an epoch's training, a validation pass) ended at tick ``at``
    (0: where its last step's work ended): that step ends there, and the time until the
    next step (validation start-up, an epoch's end) is between loops, which the summary
    names (SPEC §3)."""
    if instrumentor.is_instrumented():
        instrumentor.loop.tracker.loop_ended(at)


def pass_starts_at_next_fetch() -> None:
    """A framework iterated its loader, then ran its own start-up (hooks) before the first
    batch: that pass's first step begins at its first fetch, not at the iteration. The
    start-up is between loops (``loop_ended``)."""
    if instrumentor.is_instrumented():
        instrumentor.loop.iter_started = None


def is_hidden() -> bool:
    """True inside a forward, a fetch or ``hidden()``."""
    return instrumentor.is_instrumented() and instrumentor.loop.depth > 0


def timed_fetches(iterator):
    """Yields what ``iterator`` yields; each ``next`` is recorded as the loop's
    fetch, and the DataLoader reads inside it (a read-ahead) are part of it."""
    if not instrumentor.ensure():
        yield from iterator
        return
    instrumentor.loop_starting(now())
    fetch = _fetch.wrap_next(instrumentor.context, next)
    while True:
        try:
            batch = fetch(iterator) if instrumentor.is_instrumented() else next(iterator)
        except StopIteration:
            return
        yield batch
