"""torch.compile: compiled modules are roots timed outside dynamo (root discovery's
global hooks end: they warn and add guards); a compiled function that shows no
phase inside is timed as one Forward, or as an optimizer's step where it stepped
one (its hooks fold away in the graph)."""

from __future__ import annotations

import functools

from stepscope.core import session
from stepscope.core.recording import now

_noted: set = set()  # compiled functions already noted in run.json (once a process)


def wrap_compile(ctx, original):
    def compile(*args, **kwargs):
        target = args[0] if args else kwargs.get("model")
        if isinstance(target, ctx.torch.nn.Module):
            _compiling(ctx)  # a compiled function stops root discovery at its first call instead
        result = original(*args, **kwargs)
        if target is None:  # @torch.compile(...) with options: a decorator
            decorator = result
            return functools.wraps(decorator)(lambda fn: compiled(ctx, fn, decorator(fn)))
        return compiled(ctx, target, result)

    return compile


def compiled(ctx, target, result):
    """What torch.compile returned: a module is a root, timed outside dynamo; a
    compiled function that shows no phase inside is timed as a Forward."""
    try:
        if isinstance(result, ctx.torch.nn.Module):
            ctx.roots.adopt(result)
            return result
        if callable(result) and not isinstance(target, type):
            return _timed_compiled_function(ctx, result, getattr(target, "__qualname__", repr(target)))
    except Exception as exc:  # noqa: BLE001
        ctx.fail(exc)
    _compiling(ctx)  # anything else: at once
    return result


def _compiling(ctx) -> None:
    """Dynamo is about to trace: root discovery's global module hooks go (they
    would warn, and their removal later would fail dynamo's guards: recompiles)."""
    try:
        ctx.roots.compile_called()
    except Exception as exc:  # noqa: BLE001
        ctx.fail(exc)


def wrap_module_compile(ctx, original):
    def compile(module, *args, **kwargs):
        _compiling(ctx)
        result = original(module, *args, **kwargs)
        try:
            ctx.roots.rewrap(module)
        except Exception as exc:  # noqa: BLE001
            ctx.fail(exc)
        return result

    return compile


def _timed_compiled_function(ctx, compiled, name: str):
    """Forward and loss run inside a compiled function's graph, out of the hooks'
    sight. A call in which nothing else was observed (no phase ended inside) was
    a forward: it becomes one Forward span, when it ran inside a step (or a
    fetched batch's) or its output carries gradients (a model's forward in a loop
    with no loader). Outside both it computed on plain tensors (post-processing
    after the loop): a Forward there would open a step of its own. One that ran a
    whole step with graph breaks (its backward and optimizer seen eagerly) is left
    alone, and run.json notes that its forward is not separated. A call that
    stepped an optimizer (dynamo folds the optimizer's hooks away; its parameters'
    versions tell) is that optimizer's step: an Optimizer span."""

    @functools.wraps(compiled)
    def call(*args, **kwargs):
        if not ctx.is_on():
            return compiled(*args, **kwargs)
        # Not at torch.compile: the recipe that compiles an optimizer step (or a loss)
        # before its loop would leave the model undiscovered, its Forward unseen.
        _compiling(ctx)
        if ctx.loops.local.s.depth or ctx.is_compiling():
            return compiled(*args, **kwargs)
        st = ctx.loops.local.s
        tracker = st.tracker
        t0, seen = now(), tracker.last_end
        try:
            before = _parameter_versions(ctx)
        except Exception as exc:  # noqa: BLE001
            before = []
            ctx.fail(exc)
        result = compiled(*args, **kwargs)
        try:
            stepped = [opt for opt, p, version in before if p._version != version]
            if tracker.last_end == seen and ctx.is_on() and stepped:
                t1 = now()
                for opt in stepped:
                    tracker.optimizer_started(id(opt), t0)
                    tracker.optimizer_ended(id(opt), t0, t1)
            elif tracker.last_end == seen and ctx.is_on():
                if not (tracker.in_step() or _carries_grad(result)):
                    return result
                mode = ctx.forwards.guess_mode(st)
                tracker.forward_started(mode, t0)
                tracker.forward_ended(mode, t0, now())
            elif ctx.is_on() and name not in _noted:
                _noted.add(name)
                session.add_note(f"torch.compile: {name} runs a whole step in its graph; its Forward and Loss "
                                 "are not separated (they show as Other)")
        except Exception as exc:  # noqa: BLE001
            ctx.fail(exc)
        return result

    return call


def _parameter_versions(ctx) -> list:
    """(optimizer, a parameter, its version counter) of the optimizers an optimizer
    step would be reported for. Every in-place update bumps the counter, and a step
    updates the parameters that train: the last one that requires grad is watched."""
    only = ctx.only_optimizer
    out = []
    for opt in list(ctx.optimizers.values()):
        if only is None or id(opt) == only:
            p = _watched_parameter(opt)
            if p is not None:
                out.append((opt, p, p._version))
    return out


def _watched_parameter(optimizer):
    # from the end: a fine-tuned model's frozen layers come first, its trained head last
    for group in reversed(getattr(optimizer, "param_groups", ())):
        for p in reversed(group.get("params", ())):
            if p.requires_grad:
                return p
    return None


def _carries_grad(result) -> bool:
    """Whether a tensor of the output (or of a tuple, list or dict of them) requires grad."""
    values = result.values() if isinstance(result, dict) else result if isinstance(result, (tuple, list)) \
        else (result,)
    return any(getattr(v, "requires_grad", False) is True for v in values)
