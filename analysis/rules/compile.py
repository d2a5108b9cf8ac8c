"""torch.compile's rules (analysis/compilation.py): Recompilation, a function compiled
again because a guard failed (a new input shape, a Python number that changed, another
grad mode), and the steps that did paid for it; GraphBreak, a compiled function split
into several graphs, each place with dynamo's reason and what to change there;
Retracing, a tf.function traced again and again."""

from __future__ import annotations

from typing import Optional

import numpy as np

from stepscope.analysis.compilation import compilation, compile_events, step_compile_ns, trace_events
from stepscope.analysis.rules.base import Finding, Param, Rule
from stepscope.core.vocabulary import TRAIN

# Dynamo's reason -> what to change, first match wins (the reason's text as torch words it)
_ADVICE = (
    (("size mismatch", "stride mismatch", "dim"),
     "The input's shape changed. Mark the changing dimension dynamic (torch._dynamo.mark_dynamic(x, 0)) or "
     "compile with dynamic=True; a last short batch: drop_last=True in the DataLoader, or pad the batches to a "
     "few fixed sizes."),
    (("requires_grad", "grad_mode", "GradMode"),
     "The function ran with and without gradients (train and eval, or under torch.no_grad()): compile the "
     "training and the evaluation call as two functions, or leave evaluation uncompiled."),
    (("type", "___check_obj_id", "id("),
     "An object the function reads was replaced (a new module, optimizer or closure each call): create it once "
     "outside the loop, or pass what changes as a tensor argument."),
    (("==",),
     "A Python number the function reads changed (a learning rate, a step count, a flag): pass it as a tensor "
     "(torch.tensor(value)) so that it is data in the graph, not a constant that guards it."),
)
_GENERIC = ("A guard of the compiled function failed and it was compiled again: run with TORCH_LOGS=recompiles "
            "to see every guard, and keep what it checks constant between steps.")


class _CompileRule(Rule):
    """A rule over the compilation block: it judges where something was compiled."""

    def not_applicable(self, run):
        if not len(run.steps):
            return "no steps"
        return None if compilation(run) is not None else "nothing was compiled"


def _paid(run, spans):
    """(ns of these compile spans inside train steps, their share of train step time, the train
    steps), or None without train steps or spans."""
    train = run.steps[run.steps["mode"] == TRAIN]
    if not len(train) or not len(spans):
        return None
    paid = float(step_compile_ns(train, spans).sum())
    return paid, paid / float(train["duration_ns"].sum()), train


def advice_for(reason: str) -> str:
    for words, advice in _ADVICE:
        if any(w in reason for w in words):
            return advice
    return _GENERIC


class Recompilation(_CompileRule):
    name = "Recompilation"
    summary = ("torch.compile compiled a function again during training (a guard failed: a new input shape, a "
               "Python number that changed, another grad mode); the time those compiles took, per train step, "
               "with dynamo's reason and what to change. Only recompiles that recur are a finding: dynamo keeps "
               "each variant it compiled, so one that happens once (an evaluation under no_grad, a batch size "
               "that changed once), or none in the later half of the train steps, is paid once whatever the "
               "run's length: rules_not_applicable says what it took and what it would be over a run ten times "
               "as long. A function that hit dynamo's recompile limit (it runs uncompiled from then on) is always "
               "a finding.")
    params = {"min_share": Param(0.02, "ratio", "fire when the recompiles' time inside train steps is at least "
                                               "this share of train step time")}

    def evaluate(self, run, p):
        c = compilation(run)
        if c is None:
            return []
        if c.get("limits"):
            return [self._limit_hit(c)]
        if not c["recompiles"]:
            return []
        judged = self._judged(run)
        if judged is None or judged["one_time"] or judged["share"] < p["min_share"]:
            return []  # (a one-time recompile: why_not_judged says what it took)
        paid, share, train = judged["paid"], judged["share"], judged["train"]
        worst = max(c["functions"].items(), key=lambda kv: (kv[1]["recompiles"], kv[1]["compile_ms"]))
        place, f = worst
        reason = f["reasons"][0] if f["reasons"] else "no reason given"
        return [Finding(
            rule=self.name, severity="warning",
            message=(f"torch.compile recompiled {c['recompiles']} time(s) during training, {paid / 1e9:.2f} s inside "
                     f"train steps ({100 * share:.1f}% of train step time); {place} recompiled {f['recompiles']}x: "
                     f"{reason}"),
            recommendation=advice_for(reason),
            evidence={"recompiles": c["recompiles"], "functions": c["functions"], "recompile_s": round(paid / 1e9, 3),
                      "share": round(share, 4), "steps": c["steps"]},
            cost_ms_per_step=paid / 1e6 / len(train))]


    def _judged(self, run) -> Optional[dict]:
        """The recompiles inside train steps: what they took (``paid`` ns, ``share`` of train
        step time), in which train steps, and ``one_time``: none in the later half of the train
        steps, or a single one. Dynamo keeps every variant it compiled: a grad mode seen once
        (an evaluation under no_grad), a batch size that changed once, compiles once and never
        again, whatever the run's length; recompiles that go on into the later half recur."""
        spans, _ = compile_events(run)
        later = spans[~spans["id"].str.endswith("/0")]  # a frame's later compiles: its recompiles
        found = _paid(run, later)
        if found is None or found[0] <= 0:
            return None
        paid, share, train = found
        per_step = step_compile_ns(train, later)
        order = np.argsort(train["start_ns"].to_numpy(), kind="stable")
        paid_at = np.flatnonzero(per_step[order] > 0)  # positions, in time order, of the steps that paid
        one_time = len(paid_at) <= 1 or int(paid_at.max()) < len(train) // 2
        numbers = train["step"].to_numpy()[order][paid_at]
        return {"paid": paid, "share": share, "train": train, "one_time": bool(one_time),
                "steps": [int(x) for x in numbers]}

    def why_not_judged(self, run, p):
        """A one-time recompile over the threshold: what it took, said as paid once."""
        c = compilation(run)
        if c is None or c.get("limits") or not c["recompiles"]:
            return None
        judged = self._judged(run)
        if judged is None or not judged["one_time"] or judged["share"] < p["min_share"]:
            return None
        place, f = max(c["functions"].items(), key=lambda kv: (kv[1]["recompiles"], kv[1]["compile_ms"]))
        reason = f["reasons"][0] if f["reasons"] else "no reason given"
        seconds, steps = judged["paid"] / 1e9, len(judged["train"])
        at = ", ".join(str(x) for x in judged["steps"][:5])
        return (f"torch.compile recompiled {c['recompiles']} time(s), {seconds:.2f} s inside train step(s) {at} "
                f"({100 * judged['share']:.1f}% of these {steps} train steps), none in the later half: a one-time "
                f"cost, paid once whatever the run's length (over {10 * steps} steps it would be "
                f"{100 * judged['share'] / 10:.1f}%), not a recurring one; {place}: {reason}. To avoid even "
                f"that: {advice_for(reason)}")

    def _limit_hit(self, c):
        """A function at dynamo's recompile limit runs uncompiled from then on: the loop loses
        what compiling gave it for the rest of the run, whatever the recompiles cost."""
        hit = c["limits"][0]
        f = c["functions"].get(hit["function"], {})
        when = f"from {hit['mode']} step {hit['step']} on" if "step" in hit else "from then on"
        return Finding(
            rule=self.name, severity="warning",
            message=(f"{hit['function']} hit torch._dynamo's {hit['limit']} ({hit['value']}) after "
                     f"{f.get('compiles', '?')} compile(s): {when} it runs uncompiled (eager); dynamo's last "
                     f"reason to recompile: {hit['reason']}"),
            recommendation=(advice_for(hit["reason"]) + " Raise torch._dynamo.config." + hit["limit"]
                            + " only where the variants are few and expected: each one is another compile."),
            evidence={"limits": c["limits"], "recompiles": c["recompiles"], "functions": c["functions"]},
            cost_ms_per_step=None)  # (the uncompiled steps' loss is not measured: no compiled run to compare)


_BREAK_ADVICE = (
    (("data-dependent", "Data-dependent", "data dependent", "generic_jump", "jump"),
     "A branch on a tensor's value: write it with torch.where (both sides computed) or torch.cond, or move "
     "the decision out of the compiled function."),
    ((".item()", "item", "Tensor.tolist", "scalar"),
     "A tensor turned into a Python number (.item(), .tolist()): keep it a tensor inside the compiled "
     "function, or read it after the step (for logging, every N steps)."),
    (("print", "logging", "logger"),
     "Printing or logging inside the compiled function: move it out, or log tensors after the step."),
)
_BREAK_GENERIC = ("Each break splits the function into graphs that run apart (no fusion across it, Python between "
                  "them): run with TORCH_LOGS=graph_breaks for the full reason, and rewrite that line so that "
                  "dynamo can trace it (torch._dynamo.explain lists every break).")


def break_advice(reason: str) -> str:
    for words, advice in _BREAK_ADVICE:
        if any(w in reason for w in words):
            return advice
    return _BREAK_GENERIC


class GraphBreak(_CompileRule):
    name = "GraphBreak"
    summary = ("A function compiled with torch.compile is split into several graphs by graph breaks (a branch on "
               "a tensor's value, .item(), print, an unsupported call): each place with dynamo's reason and what "
               "to change. Its cost is not measured (a break's graphs run apart: no fusion across it).")

    def evaluate(self, run, p):
        c = compilation(run)
        # a break in torch's or another library's code (DDP's forward under compile, a compiled optimizer
        # step) is the library's structure, not the user's to change
        breaks = [b for b in (c["breaks"] if c else []) if not b["file"].startswith(("torch/", "lib/"))]
        if not breaks:
            return []
        first = breaks[0]
        reason = first.get("reason") or "dynamo gave no reason"
        places = ", ".join(f"{b['file']}:{b['line']}" for b in breaks[:5])
        advice = {}  # each different advice once, with the first place it is for
        for b in breaks[:5]:
            advice.setdefault(break_advice(b.get("reason") or ""), f"{b['file']}:{b['line']}")
        recommendation = next(iter(advice)) if len(advice) == 1 else \
            " ".join(f"At {place}: {text}" for text, place in advice.items())
        others = "".join(f"; at {b['file']}:{b['line']}: {b['reason']}" for b in breaks[1:3] if b.get("reason"))
        return [Finding(
            rule=self.name, severity="info",
            message=(f"torch.compile split the compiled code at {len(breaks)} graph break(s) ({places}); at "
                     f"{first['file']}:{first['line']}: {reason}{others}"),
            recommendation=recommendation,
            evidence={"breaks": breaks, "in_torch": [b for b in c["breaks"] if b not in breaks]})]


# A second trace is expected (a last partial batch, another mode's call): from the third on,
# a function traces for each new value of something that should not change.
MIN_TRACES = 3
_TRACE_ADVICE = {
    "python value": ("An argument is a Python number or object whose value changes (a learning rate, a step "
                     "counter, a flag): each value is a new graph. Pass it as a tensor (tf.constant(value)), or "
                     "read it from a tf.Variable."),
    "shape": ("Tensors of changing shapes: give the function an input_signature with None for the changing "
              "dimension, or tf.function(reduce_retracing=True); a last partial batch: drop_remainder=True in "
              "batch()."),
}
_TRACE_GENERIC = ("The function's signature changes between calls (new Python objects, a function made anew in a "
                  "loop): define the tf.function once, outside the loop, and pass tensors.")


class Retracing(_CompileRule):
    name = "Retracing"
    summary = ("A tf.function traced again and again during training (Python numbers as arguments, changing "
               "shapes, a function made in a loop): each trace builds a new graph. Fires from a function's third "
               "trace (a second is expected: a last partial batch), where the retraces took at least min_share of "
               "train step time.")
    params = {"min_share": Param(0.02, "ratio", "fire when the retraces' time inside train steps is at least this "
                                               "share of train step time")}

    def not_applicable(self, run):
        c = compilation(run)
        return super().not_applicable(run) or (None if c.get("tf_functions") else "no tf.function was traced")

    def evaluate(self, run, p):
        c = compilation(run)
        if c is None:
            return []
        over = {n: f for n, f in c.get("tf_functions", {}).items() if f["traces"] >= MIN_TRACES}
        if not over:
            return []
        traces = trace_events(run)
        found = _paid(run, traces[traces["function"].isin(list(over)) & (traces["n"] > 1)])
        if found is None or found[1] < p["min_share"]:
            return []
        paid, share, train = found
        name, f = max(over.items(), key=lambda kv: kv[1]["traces"])
        cause = max(f["retrace_causes"].items(), key=lambda kv: kv[1])[0] if f["retrace_causes"] else "signature"
        return [Finding(
            rule=self.name, severity="warning",
            message=(f"tf.function {name} was traced {f['traces']} times ({cause} changed); retracing took "
                     f"{paid / 1e9:.2f} s inside train steps ({100 * share:.1f}% of train step time)"),
            recommendation=_TRACE_ADVICE.get(cause, _TRACE_GENERIC),
            evidence={"functions": over, "retrace_s": round(paid / 1e9, 3), "share": round(share, 4)},
            cost_ms_per_step=paid / 1e6 / len(train))]


class CompileTime(_CompileRule):
    name = "CompileTime"
    summary = ("Compiling (torch.compile, tf.function tracing) took a large share of the run's training time: "
               "paid again at every start of the job unless the compiled artefacts are cached.")
    params = {"min_s": Param(60.0, "s", "fire when compiling inside train steps took at least this long..."),
              "min_share": Param(0.25, "ratio", "...and at least this share of train step time")}

    def evaluate(self, run, p):
        c = compilation(run)
        if c is None:
            return []
        seconds = c["train_steps_ms"] / 1e3
        if seconds < p["min_s"] or c["share_of_train"] < p["min_share"]:
            return []
        train = run.steps[run.steps["mode"] == TRAIN]
        looked = c.get("cache_hits", 0) + c.get("cache_misses", 0)
        caches = (f"; torch.compile's caches hit {c['cache_hits']} of {looked} look-up(s)" if looked else "")
        return [Finding(
            rule=self.name, severity="warning",
            message=(f"compiling took {seconds:.0f} s inside train steps, {100 * c['share_of_train']:.0f}% of train "
                     f"step time ({c['compiles']} compile(s)){caches}"),
            recommendation=("Keep the compiled artefacts between runs: torch.compile's caches (the FX graph and "
                            "AOTAutograd caches, on by default; a shared TORCHINDUCTOR_CACHE_DIR for every job, or "
                            "torch.compiler.save_cache_artifacts / load_cache_artifacts), mode='max-autotune' only "
                            "where its autotuning pays; for a short job, compile less (the model's blocks with "
                            "compile regions, or not at all)."),
            evidence={"compile_s": round(seconds, 3), "share": c["share_of_train"], "compiles": c["compiles"],
                      "cache_hits": c.get("cache_hits", 0), "cache_misses": c.get("cache_misses", 0)},
            cost_ms_per_step=c["train_steps_ms"] / max(len(train), 1))]
