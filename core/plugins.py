"""Entry points: how installed packages extend stepscope.

Group names are dotted, ``stepscope.<what>`` (``stepscope.rules``,
``stepscope.instrumentors``, ``stepscope.startup``). The first two groups were
once named ``stepscope_instrumentor`` and ``stepscope_startup``; packages that
declare those still work (``LEGACY_NAMES``): a group is read under both names,
each entry point once.

A plugin that fails to load is reported once and skipped: a broken
third-party package never breaks the job, nor the other plugins.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

INSTRUMENTORS = "stepscope.instrumentors"  # name: the module whose import turns it on; value: an Instrumentor
STARTUP = "stepscope.startup"              # callables run once at zero-edit start
RULES = "stepscope.rules"                  # analysis rules (docs/rules.md, "Custom rules")
LEGACY_NAMES = {INSTRUMENTORS: ("stepscope_instrumentor",), STARTUP: ("stepscope_startup",)}


def entry_points(group: str) -> list:
    """The entry points of ``group`` and of its legacy names, each once, not loaded."""
    from importlib.metadata import entry_points as installed

    try:
        declared = installed()
    except Exception:  # noqa: BLE001 - unreadable metadata of some distribution: no plugins
        return []
    found, seen = [], set()
    for name in (group, *LEGACY_NAMES.get(group, ())):
        if hasattr(declared, "select"):
            members = declared.select(group=name)
        else:  # Python 3.9: a dict of groups
            members = declared.get(name, ())
        for ep in members:
            if (ep.name, ep.value) not in seen:  # one package declaring both names
                seen.add((ep.name, ep.value))
                found.append(ep)
    return found


def report(message: str) -> None:
    """One ``stepscope:`` line on stderr, once per message."""
    from stepscope.core import safety

    safety.warn_once(message, message)


_report_once = report  # (``load``'s parameter of that name shadows it)


def load(ep, report: Optional[Callable[[str], None]] = None):
    """The object an entry point names; None when it fails to load, which is
    reported once (``report(message)``; by default one ``stepscope:`` line)."""
    try:
        return ep.load()
    except Exception as exc:  # noqa: BLE001 - a broken plugin is skipped
        (report or _report_once)(f"stepscope: the plugin {ep.name} = {ep.value} ({ep.group}) was not loaded "
                                 f"({type(exc).__name__}: {exc}); skipped")
        return None


def load_group(group: str, report: Optional[Callable[[str], None]] = None) -> List[Tuple[object, object]]:
    """(entry point, loaded object) for each plugin of ``group`` that loads; see ``load``."""
    loaded = []
    for ep in entry_points(group):
        obj = load(ep, report)
        if obj is not None:
            loaded.append((ep, obj))
    return loaded


def instrument_when_imported() -> None:
    """Zero-edit start's instrumenting: each registered instrumentor is loaded and
    turned on right after the script imports its module (at once if it already
    did); nothing is imported here, so ``import stepscope`` stays light."""
    from stepscope.core import importhook

    for ep in entry_points(INSTRUMENTORS):
        importhook.when_imported(ep.name, lambda module, ep=ep: _on_import(ep, module))


def _on_import(ep, module) -> None:
    instrumentor = load(ep)
    if instrumentor is not None:
        instrumentor.on_import(module)  # its failure: importhook reports it and turns stepscope off
