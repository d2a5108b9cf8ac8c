"""Subclasses of a framework's classes (callbacks), made when first needed.

A callback must subclass the framework's base class, but importing the
framework when stepscope is imported would make ``import stepscope`` heavy and
import frameworks the program never uses. So the class is built inside a
function, on first use, from the framework module the caller passes:

    @late_class("stepscope.integrations.myframework", "StepscopeCallback")
    def _callback_class(myframework):
        class StepscopeCallback(myframework.Callback):
            ...
        return StepscopeCallback

    _callback_class(sys.modules["myframework"])   # built once, then the same class

One class is made per framework module (Lightning ships under two names); it is
named as the integration exposes it (``__module__``/``__qualname__``), so reprs
and pickles by reference point at the public name, not at the builder's locals.
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, Tuple


class LateClass:
    """The class ``build(framework)`` returns, made once per framework module."""

    def __init__(self, build: Callable[[object], type], module: str, name: str):
        self._build = build
        self._module = module
        self._name = name
        self._made: Dict[str, type] = {}
        self._lock = threading.Lock()  # two threads' first fit must get one class, or isinstance fails

    def __call__(self, framework) -> type:
        cls = self._made.get(framework.__name__)
        if cls is not None:
            return cls
        with self._lock:
            cls = self._made.get(framework.__name__)
            if cls is None:
                cls = self._build(framework)
                cls.__name__ = cls.__qualname__ = self._name
                cls.__module__ = self._module
                self._made[framework.__name__] = cls
            return cls

    def made(self) -> Tuple[type, ...]:
        """The classes made so far, without building one (nor importing the framework)."""
        return tuple(self._made.values())


def late_class(module: str, name: str) -> Callable[[Callable[[object], type]], LateClass]:
    """Decorator: ``build(framework) -> class`` becomes a ``LateClass`` named ``module.name``."""

    def decorate(build: Callable[[object], type]) -> LateClass:
        return LateClass(build, module, name)

    return decorate
