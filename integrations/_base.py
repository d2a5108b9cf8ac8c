"""The integration contract: one instrumentor per framework.

Every integration is an ``Instrumentor`` (the shape of OpenTelemetry's
instrumentors):

* ``instrument()`` / ``uninstrument()`` are idempotent: an explicit second
  ``instrument()`` warns and does nothing.
* ``is_instrumented()`` says whether it is on.
* ``supported`` names the framework versions it knows (a PEP 440 specifier on
  the distribution ``distribution``); outside them it prints one line and
  patches nothing.
* Every attribute it replaces goes through ``self.patch(...)``: the patch
  registry remembers the original and ``uninstrument()`` puts every one back,
  leaving the framework exactly as it found it.
* A failure inside ``_instrument`` undoes the patches made so far and turns
  stepscope off for the process with one line (never break the job).

Zero-edit start finds instrumentors through the ``stepscope.instrumentors``
entry-point group (core/plugins.py; name: the module whose import triggers it;
value: the instrumentor object), so a third-party package can add one without
editing stepscope. integrations/_template/ is one to copy.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any, Callable, List, Optional, Tuple

from stepscope.core import safety

_MISSING = object()


class PatchRegistry:
    """Records each replaced attribute with its original, to restore them all."""

    def __init__(self):
        self._patches: List[Tuple[Any, str, Any]] = []

    def replace(self, owner, name: str, value) -> None:
        original = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else getattr(owner, name)
        setattr(owner, name, value)
        self._patches.append((owner, name, original))

    def wrap(self, owner, name: str, make_wrapper: Callable) -> Optional[Callable]:
        """Replaces owner.name with make_wrapper(original); returns the wrapper
        (None when owner has no such attribute)."""
        original = getattr(owner, name, None)
        if original is None:
            return None
        wrapper = make_wrapper(original)
        try:  # keeps __module__/__qualname__/__doc__: pickling by reference still finds the original
            functools.update_wrapper(wrapper, original)
        except (AttributeError, TypeError):
            pass
        self.replace(owner, name, wrapper)
        return wrapper

    def restore_all(self) -> None:
        while self._patches:
            owner, name, original = self._patches.pop()
            try:
                if original is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, original)
            except Exception:  # noqa: BLE001 - restore the others
                pass

    def __len__(self) -> int:
        return len(self._patches)


def distribution_version(distribution: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(distribution)
    except Exception:  # noqa: BLE001 - not installed as a distribution (a source tree)
        return None


def version_supported(installed: Optional[str], specifier: Optional[str]) -> bool:
    if not specifier or installed is None:
        return True
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return Version(installed) in SpecifierSet(specifier, prereleases=True)
    except Exception:  # noqa: BLE001 - an unparsable local version: do not refuse
        return True


class Instrumentor:
    """Base class of every integration (see the module docstring)."""

    name = ""              # short name, used in messages ("torch")
    module = ""            # the framework's module: its __version__ is checked when imported
    distribution = ""      # else this distribution's version ("torch")
    supported = ""         # PEP 440 specifier of the versions it knows (">=2.1")

    def __init__(self):
        self._patches = PatchRegistry()
        self._on = False

    # --- the public contract ----------------------------------------------------
    def instrument(self, *, stacklevel: int = 2, **kwargs) -> bool:
        """Turns the integration on; True when it is on."""
        if self._on:
            warnings.warn(f"stepscope: the {self.name} integration is already instrumented; "
                          "this call does nothing", RuntimeWarning, stacklevel=stacklevel)
            return True
        return self.ensure(**kwargs)

    def ensure(self, **kwargs) -> bool:
        """instrument() without the warning: for integrations that build on another."""
        if self._on:
            return True
        installed = self.installed_version()
        if not version_supported(installed, self.supported):
            safety.warn_once(f"unsupported:{self.name}",
                             f"stepscope: {self.name} {installed} is not supported (this integration knows "
                             f"{self.supported}); {self.name} is not profiled, the program continues unaffected")
            return False
        try:
            self._instrument(**kwargs)
        except Exception as exc:  # noqa: BLE001 - an unknown framework version must not break the job
            self._undo()
            safety.report_failure(f"cannot instrument {self.name} {installed or ''}".rstrip(), exc)
            return False
        self._on = True
        return True

    def installed_version(self) -> Optional[str]:
        loaded = sys.modules.get(self.module) if self.module else None
        version = getattr(loaded, "__version__", None)
        if isinstance(version, str):
            return version
        return distribution_version(self.distribution) if self.distribution else None

    def uninstrument(self) -> None:
        """Undoes everything instrument() did; does nothing when it is off."""
        if not self._on:
            return
        self._on = False
        self._undo()

    def is_instrumented(self) -> bool:
        return self._on

    def fail(self, exc: BaseException) -> None:
        """A failure at run time: one line, stepscope off, hooks removed."""
        safety.report_failure(f"the {self.name} integration failed", exc)
        try:
            self.uninstrument()
        except Exception:  # noqa: BLE001
            pass

    def on_import(self, module) -> None:
        """Zero-edit start: the framework module was just imported."""
        self.ensure()

    # --- for subclasses ---------------------------------------------------------------
    def patch(self, owner, name: str, make_wrapper: Callable) -> Optional[Callable]:
        return self._patches.wrap(owner, name, make_wrapper)

    def replace(self, owner, name: str, value) -> None:
        self._patches.replace(owner, name, value)

    def _instrument(self, **kwargs) -> None:
        raise NotImplementedError

    def _uninstrument(self) -> None:
        """Undo what the patch registry does not know (hooks registered through
        the framework's own API)."""

    def _undo(self) -> None:
        try:
            self._uninstrument()
        finally:
            self._patches.restore_all()
