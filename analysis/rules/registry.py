"""Which rules run: the built-in ones, custom rules from the ``stepscope.rules``
entry-point group, and those loaded with ``--rules module:Class`` (docs/rules.md,
"Custom rules"). All of them are ``Rule`` subclasses with ``Param`` declarations."""

from __future__ import annotations

import importlib
import sys
from typing import List

from stepscope.analysis.rules.base import Rule
from stepscope.core import plugins

ENTRY_POINT_GROUP = plugins.RULES

_builtin: List[Rule] = []
_custom: List[Rule] = []
_entry_points_loaded = False
load_errors: List[str] = []  # entry points that failed to load: reported, never fatal


class RuleLoadError(ValueError):
    pass


def set_builtin(rules: List[Rule]) -> None:
    _builtin[:] = rules


def builtin_rules() -> List[Rule]:
    """stepscope's own rules, in the order the summary lists them (``rules.RULES``)."""
    return list(_builtin)


def _instances(obj, where: str) -> List[Rule]:
    """A Rule subclass, an instance, or a list of either, as instances."""
    items = obj if isinstance(obj, (list, tuple)) else [obj]
    out = []
    for item in items:
        if isinstance(item, type) and issubclass(item, Rule):
            item = item()
        if not isinstance(item, Rule):
            raise RuleLoadError(f"{where} is not a stepscope Rule (subclass stepscope.analysis.rules.Rule)")
        if not getattr(item, "name", None) or not getattr(item, "summary", None):
            raise RuleLoadError(f"{where}: a rule needs the class attributes name and summary")
        out.append(item)
    return out


def register(rule) -> None:
    """Adds a custom rule (a Rule subclass or instance) for this process; same name replaces."""
    for r in _instances(rule, repr(rule)):
        if r.name in {b.name for b in _builtin}:
            raise RuleLoadError(f"custom rule {r.name!r} has the name of a built-in rule")
        _custom[:] = [c for c in _custom if c.name != r.name] + [r]


def load_spec(spec: str) -> List[Rule]:
    """``module:Class`` (or ``module:a,b``, ``module`` alone for its ``RULES`` list) -> registered rules."""
    module_name, _, attrs = spec.partition(":")
    if not module_name:
        raise RuleLoadError(f"--rules {spec!r}: expected module:Class")
    if "" not in sys.path and "." not in sys.path:
        sys.path.append("")  # a rules module beside the job, as `python -m` would find it
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module
        raise RuleLoadError(f"--rules {spec!r}: cannot import {module_name!r}: {exc}") from None
    names = [a.strip() for a in attrs.split(",") if a.strip()] or ["RULES"]
    loaded = []
    for name in names:
        if not hasattr(module, name):
            raise RuleLoadError(f"--rules {spec!r}: {module_name} has no {name!r}")
        loaded += _instances(getattr(module, name), f"--rules {module_name}:{name}")
    for r in loaded:
        register(r)
    return loaded


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in plugins.entry_points(ENTRY_POINT_GROUP):  # one discovery for every plugin group
        try:
            for r in _instances(ep.load(), f"entry point {ep.name} = {ep.value}"):
                if r.name not in {c.name for c in _custom}:  # --rules wins over an installed plugin
                    register(r)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the summary
            load_errors.append(f"custom rule entry point {ep.name} = {ep.value} not loaded: {exc}")


def all_rules() -> List[Rule]:
    """Built-in rules, then custom ones (entry points loaded on first use)."""
    _load_entry_points()
    return list(_builtin) + list(_custom)


def by_name() -> dict:
    return {r.name: r for r in all_rules()}
