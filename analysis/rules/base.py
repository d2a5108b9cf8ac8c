"""What every rule is: a name, documented parameters, the data it needs, findings with evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Tuple, Union

import pandas as pd

from stepscope.analysis.rules.whatif import saving_of
from stepscope.analysis.store.frames import as_strings

#: Finding severities, least to most severe: ``--fail-on WARN`` gates on warning and
#: error, ``--fail-on ERROR`` on error only; info never gates.
SEVERITIES = ("info", "warning", "error")
FAIL_ON = {"info": "info", "warn": "warning", "warning": "warning", "error": "error", "err": "error"}


def fail_level(word: str) -> str:
    """``--fail-on`` word (WARN, ERROR, any case) -> a severity; ValueError when unknown."""
    level = FAIL_ON.get(str(word).strip().lower())
    if level is None:
        raise ValueError(f"--fail-on {word!r}: expected WARN or ERROR (or INFO)")
    return level


def at_or_above(findings: list, level: str) -> list:
    """The findings (dicts) whose severity is ``level`` or more severe."""
    floor = SEVERITIES.index(level)
    return [f for f in findings if SEVERITIES.index(f.get("severity", "warning")
                                                     if f.get("severity") in SEVERITIES else "warning") >= floor]


@dataclass(frozen=True)
class Param:
    default: Union[float, str]
    unit: str  # "s", "ms", "%", "ratio", "MB", "steps"; "" for a choice
    doc: str
    choices: Tuple[str, ...] = ()  # a non-numeric parameter takes one of these words

    def parse(self, text: str) -> Union[float, str]:
        """A value given on the command line, checked; raises ValueError with the reason."""
        if self.choices:
            word = str(text).strip().lower()
            if word not in self.choices:
                raise ValueError(f"{text!r} is not one of {', '.join(self.choices)}")
            return word
        try:
            return float(text)
        except (TypeError, ValueError):
            raise ValueError(f"{text!r} is not a number") from None


@dataclass
class Finding:
    rule: str
    severity: str  # one of SEVERITIES
    message: str
    recommendation: str
    evidence: dict = field(default_factory=dict)
    rank: Optional[int] = None
    # Estimated time the problem costs, per train step averaged over the steps judged (None when it
    # is not a time per step: memory growth, initialization). Findings are compared by it (relate.py).
    cost_ms_per_step: Optional[float] = None
    # Set by relate.py: on a secondary finding, the primary that explains it ({rule, rank, why});
    # on a primary, the secondaries folded under it.
    related_to: Optional[dict] = None
    explains: List[dict] = field(default_factory=list)
    # SPEC §7: what fixing the cause would save (``saving_of``): {ms_per_step, share, low, high,
    # basis}; None where the rule gives no what-if of its own (evaluate then fills it from the
    # cost, with no interval: basis "cost").
    saving: Optional[dict] = None

    def as_dict(self) -> dict:
        cost = self.cost_ms_per_step
        d = {"rule": self.rule, "rank": self.rank, "severity": self.severity, "message": self.message,
             "recommendation": self.recommendation, "evidence": self.evidence,
             "cost_ms_per_step": None if cost is None or cost != cost else round(float(cost), 3),
             "saving": None if self.saving is None else dict(self.saving)}
        if self.related_to is not None:
            d["related_to"] = dict(self.related_to)
        else:
            d["explains"] = [dict(e) for e in self.explains]
        return d


#: SPEC §7: a finding whose cost per step is negligible is not a finding. Negligible is below
#: the larger of an absolute floor -- stepscope's own hooks cost about 10 us a step, so a
#: smaller cost is within what measuring does to the step -- and a share of the median
#: train step of the finding's process (of the run where the finding names none).
#: And a finding whose cost over the whole run is under MIN_TOTAL_S is no promise either:
#: a tiny job's fixed costs (a worker's start, an iterator's first call, the backends'
#: connection) are large shares of its few milliseconds of steps, and nobody changes a
#: script to win back a tenth of a second. A job profiled for real (a whole run, or a
#: window of a long one) loses seconds to any problem worth its finding.
MIN_COST_MS = 0.01
MIN_COST_SHARE = 0.01
MIN_TOTAL_S = 0.1


def _finding_steps(run, finding: "Finding"):
    """(the steps the finding's cost is per step of: its process's, its rank's, else the
    run's; how many processes those are)."""
    steps = run.steps
    process = (finding.evidence or {}).get("process")
    mine = steps[as_strings(steps["process"]) == str(process)] if process is not None else steps.iloc[:0]
    if mine.empty and finding.rank is not None:
        mine = steps[steps["rank"] == finding.rank]
    if mine.empty:
        return steps, max(int(steps["process"].nunique()), 1)
    return mine, 1


def cost_floor_ms(run, finding: "Finding") -> float:
    """The cost per step below which ``finding`` is negligible, in ms."""
    if not len(run.steps):
        return MIN_COST_MS
    mine, _ = _finding_steps(run, finding)
    train = mine[mine["mode"] == "train"]
    median_ms = float((train if len(train) else mine)["duration_ns"].median()) / 1e6
    return max(MIN_COST_MS, MIN_COST_SHARE * median_ms)


def total_cost_s(run, finding: "Finding") -> float:
    """What the finding costs over the run, in seconds of one process: its cost per step
    times that process's train steps (a rank-less finding: the ranks' mean)."""
    if not len(run.steps):
        return 0.0
    mine, processes = _finding_steps(run, finding)
    return float(finding.cost_ms_per_step) * int((mine["mode"] == "train").sum()) / processes / 1e3


def saving_from_cost(run, finding: "Finding") -> Optional[dict]:
    """The saving of a finding whose rule gives no what-if of its own: its cost per step,
    no interval (basis "cost"); None where its cost is not a time per step."""
    try:
        cost = float(finding.cost_ms_per_step)
    except (TypeError, ValueError):
        return None
    if cost != cost:
        return None
    mine, _ = _finding_steps(run, finding)
    train = mine[mine["mode"] == "train"]
    step_ms = float((train if len(train) else mine)["duration_ns"].median()) / 1e6 if len(mine) else 0.0
    return saving_of({"ms_per_step": cost}, step_ms, basis="cost")


def negligible(run, finding: "Finding") -> bool:
    """A finding whose cost per step is known and below ``cost_floor_ms``, or whose cost over
    the run is under ``MIN_TOTAL_S``. Findings whose
    cost is not a time per step (memory growth, initialization: None) are judged by their
    own rule's thresholds."""
    try:
        cost = float(finding.cost_ms_per_step)
    except (TypeError, ValueError):  # None, or a custom rule's odd value: not a time per step
        return False
    return cost == cost and (cost < cost_floor_ms(run, finding) or total_cost_s(run, finding) < MIN_TOTAL_S)


class Rule:
    """A bottleneck rule: subclasses set the class attributes and implement two methods."""

    name: ClassVar[str]
    summary: ClassVar[str]
    params: ClassVar[Dict[str, Param]] = {}

    @classmethod
    def defaults(cls) -> Dict[str, float]:
        """The rule's parameters at their defaults."""
        return {k: v.default for k, v in cls.params.items()}

    def not_applicable(self, run) -> Optional[str]:
        """None when the run has the data this rule needs, else why not."""
        return None

    def evaluate(self, run, p: Dict[str, float]) -> List[Finding]:
        raise NotImplementedError

    def why_not_judged(self, run, p: Dict[str, float]) -> Optional[str]:
        """Asked when the rule found nothing: why it could not judge, naming the figure that
        stopped it (the summary's ``rules_not_applicable``); None when it judged. SPEC §7:
        a rule never abstains in silence."""
        return None

    def details(self, run, p: Dict[str, float]) -> Optional[dict]:
        """Figures a rule reports whether or not it fires (OverallSystemUsage's percentiles);
        None for most rules. They go to the summary's ``rule_details``."""
        return None


def clean_rank(rank):
    """A rank as an int, or None for a process without one (NA, NaN, None)."""
    try:
        return None if rank is None or pd.isna(rank) else int(rank)
    except (TypeError, ValueError):
        return None


def rank_label(rank, process) -> str:
    r = clean_rank(rank)
    return f"rank {r}" if r is not None else str(process)
