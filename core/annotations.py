"""Annotations, steps and counters: the user-facing recording calls.

``annotate`` is the native function itself: a C context-manager object per
call, with no Python frame on the hot path.
"""

from __future__ import annotations

import functools
import inspect

from stepscope.core import _native
from stepscope.core.vocabulary import CATEGORIES, LOOP_MARK, MODES, PHASE_NAMES

CATEGORY = {name: i for i, name in enumerate(CATEGORIES)}
PHASES = PHASE_NAMES  # GetNext, Forward, Loss, Backward, Optimizer, Recompute (as _native.PHASES)

annotate = _native.annotate
annotation_begin = _native.annotation_begin
annotation_end = _native.annotation_end


def _decorate(name, category, func):
    """``@stepscope.annotate("name")``: a span around every call of func."""
    span = _native.annotate
    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def async_wrapper(*args, **kwargs):
            with span(name, category):
                return await func(*args, **kwargs)

        return async_wrapper

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with span(name, category):
            return func(*args, **kwargs)

    return wrapper


def _decorate_bare(func):
    """``@stepscope.annotate`` without arguments: named after the function."""
    return _decorate(getattr(func, "__qualname__", getattr(func, "__name__", repr(func))),
                     CATEGORY["annotation"], func)


_native.set_decorators(_decorate, _decorate_bare)


# ``with stepscope.phase("Forward"):`` -- a span of one of the canonical phases
# (SPEC §3); native, as cheap as annotate().
phase = _native.phase


#: True once the program marks steps itself (step()/end_step()): from then on the
#: framework integrations record phases only, and the program's steps are the steps.
by_hand = False


def step(mode: str = "train") -> int:
    """Marks the start of a new step of ``mode`` (train, eval or predict).

    Steps are contiguous: this step runs until the next ``step()`` or
    ``end_step()`` (or the end of the session). Returns the step's number,
    counted from 0 per mode.
    """
    global by_hand
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not valid; allowed: {', '.join(MODES)}")
    by_hand = True
    return _native.begin_step(mode)


def end_step() -> None:
    """Ends the current step without starting another (e.g. at the end of a loop)."""
    global by_hand
    by_hand = True
    _native.end_step()


def new_loop() -> None:
    """Marks that another training loop begins here (an integration calls it where the
    model, optimizer or ``fit`` changes): the analysis judges each loop apart."""
    if _native.enabled():
        _native.instant(CATEGORY["framework"], _native.intern(LOOP_MARK))


def counter(name: str, value: float) -> None:
    """Records a numeric sample (a loss, a queue length, a batch size...).

    Names are interned only while a session records: a program that names its
    counters by item keeps no table of them while it is not profiled."""
    if _native.enabled():
        _native.counter(CATEGORY["counter"], _native.intern(name), value)
    elif not isinstance(name, str):
        raise TypeError(f"a counter's name must be a str, not {type(name).__name__}")
