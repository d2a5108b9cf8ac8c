"""torch.compile's compiles, recompiles and graph breaks, zero edits (issue 59).

Dynamo ends every compile by recording its ``CompilationMetrics`` and handing them to
``torch._dynamo.utils.log_compilation_event`` (while ``torch._dynamo.config.
log_compilation_metrics``, its default, holds). That one call is wrapped: once per
compile, never on a step's path. Each compile becomes a ``framework`` span on the thread
that compiled, ending where the metrics were recorded and as long as dynamo measured it,
named ``COMPILE_PREFIX <compile id> <function> (<file>:<line>)`` (``backward`` for
AOTAutograd's backward graph); a recompile (a guard failed) is also an instant named
``RECOMPILE_PREFIX <compile id> <function> (<file>:<line>): <dynamo's reason>``. A graph
break shows as the compile of its resume function, ``torch_dynamo_resume_in_<f>_at_<line>``
(analysis/compilation.py reads the break's place from it); its reason comes from dynamo's
``InstructionTranslatorBase.log_graph_break`` (called once per break while tracing),
wrapped too: an instant ``GRAPH_BREAK_PREFIX <file>:<line>: <reason>``. A compile that
failed because the function hit dynamo's recompile limit (the function runs uncompiled
from then on) is no compile: an instant ``COMPILE_LIMIT_PREFIX <compile id> <limit> <value>:
<last reason>`` instead, its function found by the compile id's frame. A torch without
those functions (or with the metrics logging off) records none of it, and run.json says so.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig

from stepscope.core import importhook, session
from stepscope.core.recording import FRAMEWORK, clock_info, enabled, instant, intern, now, span
from stepscope.core.vocabulary import (COMPILE_DETAIL_PREFIX, COMPILE_LIMIT_PREFIX, COMPILE_PREFIX, GRAPH_BREAK_PREFIX,
                                      RECOMPILE_PREFIX)

MAX_REASON = 300  # characters of a recompile reason kept (a guard on a large structure can be long)
# dynamo's words for a compile refused at the recompile limit, and the limit's name and value
_LIMIT_HIT = "recompile limit exceeded"
_LIMIT = re.compile(r"exceeding the (\w+) cache size limit \(currently set to (\d+)\)")


def _library_roots() -> tuple:
    roots = {os.path.abspath(p) for key, p in sysconfig.get_paths().items()
             if key in ("stdlib", "platstdlib", "purelib", "platlib") and p}
    # stepscope's own wrappers (DDP's _pre_forward) are no place of the user's either
    roots.add(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return tuple(sorted(r + os.sep for r in roots))


_LIBRARIES = _library_roots()


def shown(path) -> str:
    """A source file as the events name it: its base name for the user's code,
    ``torch/<path in torch>`` for torch's own, ``lib/<name>`` for the standard library and
    installed packages (a break there, inside DDP's forward, is not the user's to change)."""
    path = os.path.abspath(str(path or "?"))
    torch = sys.modules.get("torch")
    root = os.path.dirname(os.path.abspath(getattr(torch, "__file__", "") or "")) if torch else ""
    if root and path.startswith(root + os.sep):
        return "torch/" + os.path.relpath(path, root).replace(os.sep, "/")
    if path.startswith(_LIBRARIES):
        return "lib/" + os.path.basename(path)
    return os.path.basename(path)


def library(name: str) -> bool:
    """Whether ``shown`` named a file of torch or of another library."""
    return name.startswith(("torch/", "lib/"))


def where(metrics) -> str:
    """The compiled function and its place: ``forward (model.py:12)``; ``backward``."""
    name = getattr(metrics, "co_name", None)
    if not name:
        return "backward" if getattr(metrics, "is_forward", None) is False else "graph"
    return f"{name} ({shown(getattr(metrics, 'co_filename', None))}:{getattr(metrics, 'co_firstlineno', None) or '?'})"


def record(metrics, ticks_per_ns: float) -> None:
    if not enabled() or getattr(metrics, "is_runtime", False):
        return
    end = now()
    duration_us = getattr(metrics, "duration_us", None)
    if duration_us is None:
        start_us, end_us = getattr(metrics, "start_time_us", None), getattr(metrics, "end_time_us", None)
        duration_us = end_us - start_us if start_us is not None and end_us is not None else 0
    start = max(end - int(duration_us * 1000 * ticks_per_ns), 0)
    compile_id = str(getattr(metrics, "compile_id", None) or "?")
    reason = getattr(metrics, "recompile_reason", None)
    reason = " ".join(str(reason).split())[:MAX_REASON] if reason else None
    failure = str(getattr(metrics, "fail_reason", None) or "")
    if _LIMIT_HIT in failure.lower():
        m = _LIMIT.search(" ".join(failure.split()))
        limit, value = (m.group(1), m.group(2)) if m else ("recompile_limit", "?")
        instant(FRAMEWORK, intern(f"{COMPILE_LIMIT_PREFIX} {compile_id} {limit} {value}: {reason or '?'}"))
        return
    place = where(metrics)
    span(FRAMEWORK, intern(f"{COMPILE_PREFIX} {compile_id} {place}"), start, end)
    if reason:
        instant(FRAMEWORK, intern(f"{RECOMPILE_PREFIX} {compile_id} {place}: {reason}"))
    detail = details(metrics)
    if detail:
        instant(FRAMEWORK, intern(f"{COMPILE_DETAIL_PREFIX} {compile_id} {detail}"))


_CACHES = ("inductor_fx_local", "inductor_fx_remote", "aotautograd_local", "aotautograd_remote")


def details(metrics) -> str:
    """``backend_ms=.. inductor_ms=.. cache_hits=.. cache_misses=..`` from the metrics this
    torch keeps (those it lacks left out; empty where it keeps none)."""
    out = []
    for key, field in (("backend_ms", "backend_compile_time_s"), ("inductor_ms", "inductor_compile_time_s")):
        seconds = getattr(metrics, field, None)
        if isinstance(seconds, (int, float)):
            out.append(f"{key}={seconds * 1e3:.3f}")
    for key, suffix in (("cache_hits", "hit_count"), ("cache_misses", "miss_count")):
        counts = [getattr(metrics, f"{cache}_cache_{suffix}", None) for cache in _CACHES]
        counts = [n for n in counts if isinstance(n, int)]
        if counts:
            out.append(f"{key}={sum(counts)}")
    return " ".join(out)


def install(ctx) -> None:
    """From the moment dynamo's utilities are imported (the first compile, or earlier)."""
    ticks_per_ns = float(clock_info().get("ticks_per_ns", 1.0) or 1.0)

    def imported(utils):
        if not ctx.is_on():
            return
        if not callable(getattr(utils, "log_compilation_event", None)):
            session.add_note("torch.compile: this torch has no compilation metrics hook "
                             "(torch._dynamo.utils.log_compilation_event): compiles are not recorded")
            return

        def wrap(original):
            def log_compilation_event(metrics, *args, **kwargs):
                try:
                    return original(metrics, *args, **kwargs)
                finally:
                    try:
                        record(metrics, ticks_per_ns)
                    except Exception as exc:  # noqa: BLE001
                        ctx.fail(exc)

            return log_compilation_event

        ctx.patch(utils, "log_compilation_event", wrap)

    importhook.when_imported("torch._dynamo.utils", imported)

    def translator(module):
        if not ctx.is_on():
            return
        cls = getattr(module, "InstructionTranslatorBase", None)
        if not callable(getattr(cls, "log_graph_break", None)):
            return  # (the breaks' places still come from their resume functions)

        def wrap(original):
            def log_graph_break(tx, code_options, reason, *args, **kwargs):
                try:
                    return original(tx, code_options, reason, *args, **kwargs)
                finally:
                    try:
                        graph_break(args[0] if args else kwargs.get("exc"), reason, code_options)
                    except Exception as exc:  # noqa: BLE001
                        ctx.fail(exc)

            return log_graph_break

        ctx.patch(cls, "log_graph_break", wrap)

    importhook.when_imported("torch._dynamo.symbolic_convert", translator)


def graph_break(exc, reason, code_options) -> None:
    """One graph break, where the user's code made it (the innermost user frame)."""
    if not enabled():
        return
    stack = getattr(exc, "real_stack", None)
    if not stack:
        import torch._guards

        stack = torch._guards.TracingContext.extract_stack()
    if stack:  # where it broke: in a library's code (torch's own, DDP's), the library's, not the user's
        path, line = stack[-1].filename, stack[-1].lineno
    else:
        path, line = code_options.get("co_filename", "?"), code_options.get("co_firstlineno", "?")
    instant(FRAMEWORK, intern(f"{GRAPH_BREAK_PREFIX} {shown(path)}:{line}: {break_reason(reason)}"))


def break_reason(reason) -> str:
    """Dynamo's reason in one line: its first, or where that only says which bytecode it was
    tracing ("Encountered graph break when attempting to trace CALL: ..."), the line after,
    which names what it could not trace ("Unsupported Tensor.item() call ...")."""
    lines = [" ".join(line.split()) for line in str(reason).split("\n")]
    lines = [line for line in lines if line]
    if not lines:
        return "?"
    first = lines[0]
    if first.startswith("Encountered graph break") and len(lines) > 1:
        first = lines[1]
    return first[:MAX_REASON]
