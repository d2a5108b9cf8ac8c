"""What every rule is: a name, documented parameters, the data it needs, findings with evidence."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar, Dict, List, Optional

import pandas as pd


@dataclass(frozen=True)
class Param:
    default: float
    unit: str  # "s", "ms", "%", "ratio", "MB", "steps"
    doc: str


@dataclass
class Finding:
    rule: str
    severity: str  # "warning" or "info"
    message: str
    recommendation: str
    evidence: dict = field(default_factory=dict)
    rank: Optional[int] = None

    def as_dict(self) -> dict:
        d = asdict(self)
        return {"rule": d["rule"], "rank": d["rank"], "severity": d["severity"], "message": d["message"],
                "recommendation": d["recommendation"], "evidence": d["evidence"]}


class Rule:
    """A bottleneck rule: subclasses set the class attributes and implement two methods."""

    name: ClassVar[str]
    summary: ClassVar[str]
    params: ClassVar[Dict[str, Param]] = {}

    def not_applicable(self, run) -> Optional[str]:
        """None when the run has the data this rule needs, else why not."""
        return None

    def evaluate(self, run, p: Dict[str, float]) -> List[Finding]:
        raise NotImplementedError


def clean_rank(rank):
    """A rank as an int, or None for a process without one (NA, NaN, None)."""
    try:
        return None if rank is None or pd.isna(rank) else int(rank)
    except (TypeError, ValueError):
        return None


def rank_label(rank, process) -> str:
    r = clean_rank(rank)
    return f"rank {r}" if r is not None else str(process)
