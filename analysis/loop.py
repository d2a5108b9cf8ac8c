"""Whether stepscope understood the training loop: notes for the summary and the report.

Integrations find steps from what they see (a batch fetched, a forward, a
backward, an optimizer step; SPEC §3). A loop whose backward or optimizer step
they do not see -- ``torch.distributed.autograd.backward`` with a
``DistributedOptimizer`` over RPC, parameters updated by hand without a
backward (zeroth-order or evolutionary updates of ``p.data``), a framework
stepscope does not instrument -- is recorded as one long step per process, and
a program that stopped before its loop records nothing at all. ``loop_notes``
says so, from the steps and phases tables (and, where the steps are right but
the forward pass ran where no hook looks, that its time is in Other); the
thresholds are documented in docs/rules.md ("When the loop is not understood").
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Union

import numpy as np
import pandas as pd

from stepscope.analysis.ending import frameworks_known, run_ending
from stepscope.core.frameworks import step_marking_display_names
from stepscope.core.vocabulary import BACKWARD, COMPILING_PREFIXES, FORWARD, OPTIMIZER, TRACE_PREFIX, TRAIN

# The phases table, or what gives it when asked: it is read only for steps without a
# backward and an optimizer step (a long run's phases are tens of millions of rows)
Phases = Union[pd.DataFrame, Callable[[], pd.DataFrame]]

MIN_FORWARDS = 8  # forwards piled up in one train step with no backward and no optimizer step
MAX_FEW_STEPS = 3  # a process with at most this many train steps has "few steps"...
MIN_STEP_SHARE = 0.5  # ...and one of them holding more than this share of its profiled time is suspect

MIN_BLIND_STEPS = 3  # train steps with a backward or optimizer step and never a forward: the forward is unseen
NOT_DELIMITED, NO_STEPS, NOTHING_RECORDED = "steps_not_delimited", "no_steps", "nothing_recorded"
FORWARD_NOT_SEEN = "forward_not_seen"
COLLECTION = "collection_between_updates"
COLLECTION_RATIO = 4  # a collecting step's forwards against its process's median train step's
COLLECTION_MAX_SHARE = 0.5  # collecting steps are a minority of the train steps: the recurring exception

HOW_TO_MARK = ("mark the loop's iterations by hand: call stepscope.step() at the top of each iteration "
               "(stepscope.step(\"eval\") in evaluation), and wrap its parts in "
               "`with stepscope.phase(\"Forward\"):` (likewise GetNext, Loss, Backward, Optimizer); "
               "`with stepscope.annotate(\"name\"):` names any other part.")


def _note(key: str, title: str, message: str, recommendation: str, evidence: dict) -> dict:
    return {"key": key, "severity": "warning", "title": title, "message": message,
            "recommendation": recommendation, "evidence": evidence}


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _label(rank, process) -> str:
    return f"rank {int(rank)}" if rank is not None and not pd.isna(rank) else str(process)


def collection_steps(steps: pd.DataFrame, phases: Phases) -> pd.DataFrame:
    """The train steps that begin with a collection before their update: a rollout of a
    policy before a PPO update, a replay buffer filled, features computed ahead under
    no_grad. Such a step has at least ``MIN_FORWARDS`` forward passes and
    ``COLLECTION_RATIO`` times the median train step's of its process, and those steps are
    a minority (``COLLECTION_MAX_SHARE``): every step with two forwards is the loop's own
    shape (a target network), not a collection. Columns: process, rank, step, forwards, and
    collect_ns, from the step's start to the start of its last forward before its first
    backward (the update's own forward). The phases are read only where a step's Forward
    time is that many times the median's."""
    cols = ["process", "rank", "step", "forwards", "collect_ns"]
    train = steps[steps["mode"] == TRAIN] if len(steps) else steps
    if len(train) < 2 * MIN_FORWARDS or FORWARD not in train:
        return pd.DataFrame({c: [] for c in cols})
    median_fwd = train.groupby(train["process"].astype(str))[FORWARD].transform("median").to_numpy(dtype=float)
    heavy = train[(train[FORWARD].to_numpy(dtype=float) >= COLLECTION_RATIO * np.maximum(median_fwd, 1.0))
                  & (train[BACKWARD] > 0).to_numpy()]
    if heavy.empty:
        return pd.DataFrame({c: [] for c in cols})
    ph = phases() if callable(phases) else phases
    ph = ph[(ph["mode"] == TRAIN) & ph["name"].isin([FORWARD, BACKWARD])]
    ph = ph.assign(process=ph["process"].astype(str))
    counts = ph[ph["name"] == FORWARD].groupby(["process", "step"]).size()
    rows = []
    for process, mine in heavy.groupby(heavy["process"].astype(str), sort=False):
        per_step = counts.loc[process] if process in counts.index.get_level_values(0) else pd.Series(dtype=int)
        n_train = int((train["process"].astype(str) == process).sum())
        median = float(per_step.reindex(train.loc[train["process"].astype(str) == process, "step"]).fillna(0).median())
        want = max(MIN_FORWARDS, COLLECTION_RATIO * max(median, 1.0))
        hits = mine[mine["step"].map(per_step).fillna(0).to_numpy() >= want]
        if hits.empty or len(hits) > COLLECTION_MAX_SHARE * n_train:
            continue
        own = ph[(ph["process"] == process) & ph["step"].isin(set(hits["step"]))]
        for r in hits.itertuples():
            p = own[own["step"] == r.step]
            back = p.loc[p["name"] == BACKWARD, "start_ns"]
            fwd = p.loc[(p["name"] == FORWARD) & (p["start_ns"] < (back.min() if len(back) else np.inf)), "start_ns"]
            if not len(fwd):
                continue
            rows.append((process, r.rank, int(r.step), int(per_step.get(r.step, 0)),
                         max(int(fwd.max()) - int(r.start_ns), 0)))
    return pd.DataFrame(rows, columns=cols) if rows else pd.DataFrame({c: [] for c in cols})


def _collection_note(steps: pd.DataFrame, phases: Phases) -> List[dict]:
    """The ``collection_between_updates`` note: per process with collecting train steps,
    how many, how often, their forwards and what the collection took of the train steps."""
    found = collection_steps(steps, phases)
    if found.empty:
        return []
    train = steps[steps["mode"] == TRAIN]
    out = []
    for process, c in found.groupby("process", sort=False):
        mine = train[train["process"].astype(str) == process]
        total = float(mine["duration_ns"].sum())
        share = float(c["collect_ns"].sum()) / total if total > 0 else 0.0
        numbers = sorted(int(x) for x in c["step"])
        gaps = np.diff(numbers)
        every = f", every {int(np.median(gaps))} steps" if len(gaps) else ""
        rank = c["rank"].iloc[0]
        out.append({"process": process, "rank": None if pd.isna(rank) else int(rank), "steps": numbers,
                    "train_steps": int(len(mine)),
                    "forwards_median": int(c["forwards"].median()), "collect_s": round(float(c["collect_ns"].sum())
                                                                                       / 1e9, 3),
                    "share": round(share, 4), "every": every})
    b = out[0]
    label = _label(b["rank"], b["process"])
    listed = ", ".join(str(x) for x in b["steps"][:8]) + (" ..." if len(b["steps"]) > 8 else "")
    more = f" (and the same in {len(out) - 1} other process(es))" if len(out) > 1 else ""
    message = (f"{label}: {len(b['steps'])} of {b['train_steps']} train steps (steps {listed}{b['every']}) begin "
               f"with a collection before their update: about {b['forwards_median']} forward passes with no "
               f"backward between them (a rollout of the policy, a replay buffer filled, features computed "
               f"ahead), {b['collect_s']:.2f} s in all, {100 * b['share']:.1f}% of the train steps' time{more}. "
               "That time is counted in those steps (their Forward); they are not outliers.")
    return [_note(COLLECTION, "A collection before updates", message,
                  "Where the collection is the larger part: step many environments at once (vectorized "
                  "environments, one batched forward of the policy for all of them), collect in parallel "
                  "workers while the learner updates (an actor-learner split), or keep the policy's forward "
                  "off the host's critical path (inference under torch.inference_mode, on the device).",
                  {"processes": [{k: v for k, v in o.items() if k != "every"} for o in out]})]


def undelimited_steps(steps: pd.DataFrame, phases: Phases, profiled_ns: Dict[str, int]) -> List[dict]:
    """Per process, its worst train step that stands for many iterations stepscope could not
    tell apart: a step with ``MIN_FORWARDS`` forwards or more and no backward and no
    optimizer step, or, in a process with at most ``MAX_FEW_STEPS`` train steps and no
    backward or optimizer step in any of them, a step holding more than ``MIN_STEP_SHARE``
    of the process's profiled time (its first to its last event)."""
    train = steps[steps["mode"] == TRAIN]
    if train.empty:
        return []
    # Whole-column operations on integer keys: a lookup per step took 31 s on a 1.67 M-step run.
    codes, names = pd.factorize(train["process"])
    names = [str(q) for q in names]
    step = train["step"].to_numpy(dtype=np.int64)
    blind = (train[BACKWARD].to_numpy() <= 0) & (train[OPTIMIZER].to_numpy() <= 0)
    if not blind.any():  # every train step has its backward or optimizer step: the phases are not read
        return []
    phases = phases() if callable(phases) else phases
    fw = phases[(phases["name"] == FORWARD) & (phases["mode"] == TRAIN)]
    fw_codes, fw_names = pd.factorize(fw["process"])
    known = {q: i for i, q in enumerate(names)}
    fw_codes = np.array([known.get(str(q), -1) for q in fw_names], dtype=np.int64)[fw_codes]
    key = lambda c, k: c * (1 << 32) + (k + (1 << 31))  # noqa: E731 - (process, step) as one int64
    forwards = pd.Series(key(fw_codes, fw["step"].to_numpy(dtype=np.int64))).value_counts()
    count = forwards.reindex(key(codes, step)).fillna(0).to_numpy(dtype=np.int64)
    profiled = np.array([float(profiled_ns.get(q) or 0) for q in names])[codes]
    duration = train["duration_ns"].to_numpy(dtype=float)
    share = np.divide(duration, profiled, out=np.zeros(len(codes)), where=profiled > 0)
    n = np.bincount(codes, minlength=len(names))[codes]
    all_blind = (np.bincount(codes, weights=~blind, minlength=len(names)) == 0)[codes]
    piled = blind & (count >= MIN_FORWARDS)
    long = blind & (share > MIN_STEP_SHARE) & (n <= MAX_FEW_STEPS) & all_blind
    bad = np.flatnonzero(piled | long)
    if not len(bad):
        return []
    # per process, its longest bad step (the first of equals, in table order)
    worst = pd.Series(duration[bad]).groupby(codes[bad]).idxmax()
    rank = train["rank"].to_numpy()
    out = []
    for c, j in sorted(worst.items(), key=lambda cj: names[cj[0]]):
        i = bad[j]
        out.append({"process": names[c], "rank": None if pd.isna(rank[i]) else int(rank[i]),
                    "train_steps": int(n[i]), "step": int(step[i]), "duration_ms": round(float(duration[i]) / 1e6, 3),
                    "share_of_profiled": round(float(share[i]), 4), "forwards": int(count[i]),
                    "profiled_s": round(float(profiled[i]) / 1e9, 3),
                    "why": [w for w, hit in (("forwards_piled_up", piled[i]), ("one_long_step", long[i])) if hit]})
    return out


def loop_notes(steps: pd.DataFrame, phases: Phases, profiled_ns: Dict[str, int], recorded: int,
               frameworks: Optional[List[str]] = None, ended: bool = True, duration_s: float = 0.0,
               ending: Optional[dict] = None, traced: Optional[dict] = None) -> List[dict]:
    """Notes on a loop stepscope did not understand, each with a stable ``key``:
    ``steps_not_delimited``, ``no_steps``, ``nothing_recorded`` (see ``undelimited_steps``),
    ``forward_not_seen``.

    phases: the phases table, or a function that gives it (read only if needed);
    profiled_ns: per process folder, the time from its first to its last event;
    recorded: events other than system samples; frameworks: the distributions the
    run had imported (None: not known, as in a run that did not close); ended: the run has
    an end time (it was not killed); ending: how it ended (analysis/ending.py), which
    decides over ``ended`` when given; traced: the tf.functions traced (``_tf_traces``), what a
    TensorFlow run that recorded nothing else did show."""
    used = step_marking_display_names(frameworks)
    if steps.empty and not recorded:
        if ending is not None:
            ended = ending["complete"]
        if not ended:
            why = _unclosed_why(ending)
        else:
            why = ("The program most likely stopped before its training loop began: an exception, a missing "
                   "file, argument or device, or an early exit (look at its output and exit status).")
        if ended and "TensorFlow" in used and "PyTorch" not in used:
            why = ("The program ran TensorFlow, where stepscope finds steps in Keras's fit, evaluate and "
                   "predict (and train_on_batch), in tf.data iterators, and in loops of their own through the "
                   "optimizer (each call of a function that applies a Keras or tf.compat.v1 optimizer's "
                   "gradients, a tf.function or eager): a loop that updates its variables another way (by hand, "
                   "an optimizer stepscope does not know), with no tf.data dataset, shows none of them; nor does "
                   "a program that stopped before its loop (look at its output and exit status)."
                   + _traced(traced))
        elif frameworks is None:
            why += (" Which frameworks it imported is not known: stepscope records them when a process closes, "
                    "and this one did not.")
        elif used:
            why += f" It had imported {', '.join(used)}, but no model ran a forward pass that stepscope saw."
        else:
            why += (" It imported none of the frameworks stepscope instruments (PyTorch, Lightning, Keras, "
                    "TensorFlow): a loop in anything else records nothing unless it marks its own steps.")
        state = ending["state"] if ending is not None else "closed" if ended else "not_closed"
        fix = {"not_closed": "Let the program reach its end (or call stepscope.stop() before os._exit), or "
                             "lower STEPSCOPE_FLUSH_MS, and run it again.",
               "running": "Look again once the run has written its first flush (or follow it with "
                          "stepscope watch)."}.get(state, "Fix what stopped the program and run it again. "
                                                          "If its loop did run, " + HOW_TO_MARK)
        return [_note(NOTHING_RECORDED, "Nothing was recorded",
                      f"Nothing was recorded in {duration_s:.1f} s: no steps, no phases, no annotations. {why}",
                      fix,
                      {"duration_s": round(duration_s, 3), "frameworks": None if frameworks is None else used,
                       "ended": bool(ended), "state": state, "tf_functions_traced": traced})]
    if steps.empty:
        return [_note(NO_STEPS, "No steps were recorded",
                      f"No steps were recorded, although {recorded} other events were (phases, annotations, "
                      "counters): stepscope did not see where the loop's iterations begin, so there are no step "
                      "times and no phase shares, and the rules that need steps did not run.",
                      _capital(HOW_TO_MARK), {"recorded_events": int(recorded), "frameworks": used})]
    bad = undelimited_steps(steps, phases, profiled_ns)
    if not bad:
        return _forward_not_seen(steps, used) + _collection_note(steps, phases)
    b = bad[0]
    what = []
    if b["forwards"] >= MIN_FORWARDS:
        what.append(f"{b['forwards']} forward passes piled up in it")
    if "one_long_step" in b["why"]:
        what.append(f"it holds {100 * b['share_of_profiled']:.0f}% of the {b['profiled_s']:.1f} s the process "
                    "was profiled")
    more = f" (and the same in {len(bad) - 1} other process(es))" if len(bad) > 1 else ""
    message = (f"Steps could not be delimited: {_label(b['rank'], b['process'])} recorded {b['train_steps']} "
               f"train step(s), and step {b['step']} lasts {b['duration_ms'] / 1e3:.2f} s with no backward and "
               f"no optimizer step that stepscope saw; {' and '.join(what)}{more}. The loop's backward or "
               "optimizer runs where stepscope does not look (torch.distributed.autograd with a "
               "DistributedOptimizer over RPC, parameters updated by hand without a backward, a framework "
               "stepscope does not instrument), so many iterations were recorded as one step: the step times, "
               "the phase shares and the findings built on them do not describe single iterations.")
    return [_note(NOT_DELIMITED, "Steps could not be delimited", message, _capital(HOW_TO_MARK),
                  {"processes": bad})]


def _traced(traced: Optional[dict]) -> str:
    if not traced:
        return ""
    names = ", ".join(traced["functions"])
    return (f" What stepscope saw: it traced the tf.function(s) {names} ({traced['traces']} trace(s)), and the "
            f"process ran {traced['after_s']:.1f} s more after the last trace ended (the notes above say what it "
            "saw of their calls).")


def _tf_traces(run, end_ns: int) -> Optional[dict]:
    """The tf.function traces of a run (their function names, how many, and how long the run
    went on after the last one), or None."""
    names = run.event_names(TRACE_PREFIX)
    if not names:
        return None
    spans = run.select(categories=["framework"], names=names, columns=["name", "end_ns"])
    if spans.empty:
        return None
    functions = sorted({str(n)[len(TRACE_PREFIX):].strip().split("#")[0] for n in spans["name"].unique()})
    return {"functions": functions[:8], "traces": int(len(spans)),
            "after_s": round(max(0, end_ns - int(spans["end_ns"].max())) / 1e9, 3)}


def _unclosed_why(ending: Optional[dict]) -> str:
    """Why a run that did not close recorded nothing: written events only reach the file
    once a flush interval, so a process that ends inside its first one leaves none."""
    if ending is None:
        return "The run has no end time: the program was killed (or is still running) before its loop began."
    flush = f"{ending['flush_interval_ms']} ms, STEPSCOPE_FLUSH_MS"
    if ending["state"] == "unknown":
        return (f"The run did not close, and its process ran on another host: it is still running there, or "
                f"ended without closing within its first flush interval ({flush}); either way nothing of its "
                "loop was written.")
    if ending["state"] == "running":
        return (f"The run is still running and has written nothing yet (the writer flushes every {flush}): "
                "look again later.")
    return (f"The process ended without closing (os._exit, SIGKILL, an out-of-memory kill) within its first "
            f"flush interval ({flush}), so nothing of its loop was written: whether its loop began cannot be "
            "told.")


def _forward_not_seen(steps: pd.DataFrame, used: List[str]) -> List[dict]:
    """Train steps that each have a backward or an optimizer step, none of them a forward:
    the model's forward runs outside what stepscope hooks (in PyTorch, outside every
    nn.Module: `xb @ weights + bias`), so its time is in Other."""
    if "TensorFlow" in used and "PyTorch" not in used:
        return []  # TensorFlow's custom loops measure no forward by design, and run.json says so
    train = steps[steps["mode"] == TRAIN]
    worked = (train[BACKWARD] > 0) | (train[OPTIMIZER] > 0)
    if len(train) < MIN_BLIND_STEPS or (train[FORWARD] > 0).any() or not worked.all():
        return []
    where = ("outside every torch.nn.Module (plain tensor code such as `xb @ weights + bias`, or a function "
             "of parameters held in a list)" if "PyTorch" in used else "where stepscope's hooks do not look")
    return [_note(FORWARD_NOT_SEEN, "The forward pass was not seen",
                  f"All {len(train)} train steps have a backward or an optimizer step, and none has a forward "
                  f"pass that stepscope saw: the model's forward runs {where}. The step counts and times are "
                  "right, but the forward's time (and the loss's) is counted in Other.",
                  "Make the model an nn.Module (its forward is then timed as Forward, its loss as Loss), or "
                  "wrap the forward in `with stepscope.phase(\"Forward\"):` (likewise Loss).",
                  {"train_steps": int(len(train)), "frameworks": used})]


def _compiling_events(run) -> int:
    """The events compiling and tracing left (torch.compile, tf.function, JAX): a framework's
    own work, no sign that the loop recorded anything."""
    names = [n for n in run.event_names() if n.startswith(COMPILING_PREFIXES)]
    return len(run.select(categories=["framework"], names=names, columns=["start_ns"])) if names else 0


def run_loop_notes(run, ending: Optional[dict] = None) -> List[dict]:
    """``loop_notes`` of a loaded run; ending: analysis/ending.py's ``run_ending(run)``."""
    ending = run_ending(run) if ending is None else ending
    extents = run.extents()
    if len(extents):
        profiled = {str(p): int(r.end_ns - r.start_ns) for p, r in extents.iterrows()}
        recorded = int(extents["recorded"].sum()) - _compiling_events(run)
        duration_s = (int(extents["end_ns"].max()) - int(extents["start_ns"].min())) / 1e9
    else:
        profiled, recorded, duration_s = {}, 0, float(run.info.get("duration_s") or 0.0)
    frameworks = list(run.versions) if frameworks_known(run, ending) else None
    steps = run.steps
    traced = _tf_traces(run, int(extents["end_ns"].max())) if steps.empty and not recorded and len(extents) else None
    return loop_notes(steps, lambda: run.phases, profiled, recorded, frameworks, ending["complete"], duration_s,
                      ending, traced)


def loop_markdown() -> List[str]:
    """The section of docs/rules.md on these notes."""
    return ["## When the loop is not understood", "",
            "`stepscope summary` (text and `--json`, under `loop_notes`) and the report's verdict say so when "
            "a run's steps cannot be trusted; each note has a stable `key`, a `message`, a `recommendation` "
            "and its `evidence` (`stepscope.analysis.loop.loop_notes`, over the steps and phases tables):", "",
            "| key | when |", "| --- | --- |",
            f"| `{NOT_DELIMITED}` | a process's train step has no backward and no optimizer step stepscope saw, "
            f"and either at least {MIN_FORWARDS} forward passes piled up in it, or the process has at most "
            f"{MAX_FEW_STEPS} train steps, none with a backward or optimizer step, and this one holds more than "
            f"{100 * MIN_STEP_SHARE:.0f}% of the process's profiled time (its first to its last event). "
            "Evidence: per process, its longest such step (`forwards`, `share_of_profiled`, `why`) |",
            f"| `{NO_STEPS}` | no steps, but phases, annotations or counters were recorded |",
            f"| `{NOTHING_RECORDED}` | no steps and no events beyond the system samples: the program stopped "
            "before its loop (the note says whether the run ended or was killed, and which frameworks it "
            "had imported where that is known: stepscope records them when a process closes), a process "
            "that ended without closing within its first flush interval (`STEPSCOPE_FLUSH_MS`; nothing of "
            "its loop was written, `evidence.state` `not_closed`) or a run still running (`running`), "
            "or, in a TensorFlow program that ended, a loop of its own with no Keras fit and no tf.data iterator "
            "(the note names that cause first) |",
            f"| `{FORWARD_NOT_SEEN}` | at least {MIN_BLIND_STEPS} train steps, every one with a backward or an "
            "optimizer step and none with a forward: the model's forward runs outside what stepscope hooks "
            "(in PyTorch, outside every `nn.Module`), and its time is in Other |",
            f"| `{COLLECTION}` | (a note on a loop understood) train steps that begin with a collection before "
            f"their update: at least {MIN_FORWARDS} forward passes and {COLLECTION_RATIO} times the median "
            f"train step's, in at most {100 * COLLECTION_MAX_SHARE:.0f}% of the train steps (a PPO rollout, a "
            "replay buffer filled). The note gives their steps, how often, and the collection's share of the "
            "train steps' time (from each step's start to its update's forward); StepOutlier does not call them "
            "outliers |", "",
            "A loop whose backward or optimizer stepscope does not see (`torch.distributed.autograd.backward` "
            "with a `DistributedOptimizer` over RPC, parameters updated by hand without a backward) is "
            "otherwise one long step per process. A gradient-accumulation step (many forwards, each with its "
            "backward) or a rollout before one backward has a backward: it is not flagged. The fix the notes "
            "recommend: `stepscope.step()` at the top of each iteration, and `with stepscope.phase(...)` "
            "around its parts.", ""]
