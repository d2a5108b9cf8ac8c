"""Wrappers of a framework's user-facing calls that leave no frame in tracebacks.

A Python wrapper's frame shows in every traceback that passes through it (and
Keras's traceback filter keeps it, dropping the frame that raised: issue 47).
``frameless`` builds the wrapper in C (``recording.around``, csrc/common/around.cc):

* ``before(*args, **kwargs)`` returns None (call the original as is) or
  ``(args, kwargs, token)``: the original is called with those, then
  ``after(token, exc)`` runs (exc: what the original raised, or None);
* ``with_result=True``: ``after(token, exc, result)``, result what the original
  returned (None where it raised), e.g. a collective's ``Work``;
* a failure of before/after is reported once and turns stepscope off; the
  original's result or exception reaches the caller unchanged.
"""

from __future__ import annotations

from typing import Callable, Optional

from stepscope.core import safety
from stepscope.core.recording import around


def _nothing_after(token, exc, result=None) -> None:
    pass


def frameless(original: Callable, before: Callable, after: Optional[Callable] = None,
              what: str = "a stepscope wrapper failed", fail: Optional[Callable] = None,
              with_result: bool = False) -> Callable:
    """``fail(exc)``: what a failure of before/after does (default: reported once, stepscope
    off, ``what`` naming it)."""
    def report(exc: BaseException) -> None:
        safety.report_failure(what, exc)

    if with_result:
        return around(original, before, after or _nothing_after, fail or report, True)
    return around(original, before, after or _nothing_after, fail or report)
