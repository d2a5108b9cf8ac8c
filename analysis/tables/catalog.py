"""The run's tables as the stores build them: one ``Recipe`` per pass, each ``Table``
declared with its columns and description (``store/schema.py``) beside the builder
that makes it. ``catalog()`` adds the tables plugins declare (entry-point group
``stepscope.tables``: a ``Recipe`` or a list of them).

Adding a table (docs/design.md, "Adding a table"): its columns in ``store/schema.py``
(or in the plugin), its builder in a module of ``tables/``, its recipe here.
"""

from __future__ import annotations

import functools

from stepscope.analysis.store.recipe import Catalog, Recipe, Table
from stepscope.analysis.store.schema import DESCRIPTIONS, DTYPES, GPU_TABLES, KERNEL_AGGREGATES
from stepscope.analysis.tables import gpu, gpu_build, kernel_steps, stepping
from stepscope.analysis.tables.system import system_frame
from stepscope.core import plugins
from stepscope.core.vocabulary import COMPILING_PREFIXES, LOOP_MARK

TABLES_GROUP = "stepscope.tables"  # plugins' recipes


def table(name: str, **options) -> Table:
    return Table(name, DTYPES[name], DESCRIPTIONS[name], **options)


def _system(events):
    return {"system": system_frame(events)}


def _steps(events, consume: bool = False):
    steps, phases = stepping.steps_and_phases(events, consume=consume)
    return {"steps": steps, "phases": phases}


def _gpu(gpu_raw, steps, phases, shared=None, nearby=None):
    return gpu_build.gpu_tables(gpu_raw, steps, phases, other_api=nearby, timeline=shared)


def _kernel_aggregates(kernels):
    return kernel_steps.aggregate(kernels)


BUILT_IN = Catalog((
    # (system first: the steps' pass may consume the events)
    Recipe((table("system", sort_by="timestamp_ns"),), ("events",), _system, event_categories=("system",)),
    Recipe((table("steps"), table("phases")), ("events",), _steps, consumes=True,
           event_categories=("step", "phase", "comm"), event_names=(LOOP_MARK, *COMPILING_PREFIXES)),
    # (memcpy, memset and sync: a few rows a step)
    Recipe(tuple(table(t, few_rows=t in ("memcpy", "memset", "sync")) for t in GPU_TABLES),
           ("gpu_raw", "steps", "phases"), _gpu, by_part=True,
           prepare=gpu.Timeline),
    Recipe(tuple(table(t, sort_by="name" if t == "kernel_names" else "step") for t in KERNEL_AGGREGATES),
           ("kernels",), _kernel_aggregates,
           combine=kernel_steps.combine),
))


@functools.lru_cache(maxsize=1)
def catalog() -> Catalog:
    """The built-in recipes, then those of installed plugins (a broken one reported once, skipped)."""
    extra = []
    for ep, obj in plugins.load_group(TABLES_GROUP):
        recipes = obj if isinstance(obj, (list, tuple)) else [obj]
        good = [r for r in recipes if isinstance(r, Recipe)]
        if len(good) != len(recipes):
            plugins.report(f"stepscope: the plugin {ep.name} = {ep.value} ({TABLES_GROUP}) is not a Recipe; skipped")
            continue
        try:  # declared right, and built right from empty inputs
            BUILT_IN.with_recipes(extra + good).empty
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break reading runs
            plugins.report(f"stepscope: the plugin {ep.name} = {ep.value} ({TABLES_GROUP}) was not loaded "
                           f"({type(exc).__name__}: {exc}); skipped")
            continue
        extra += good
    return BUILT_IN.with_recipes(extra)
