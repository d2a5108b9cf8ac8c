"""Bottleneck rules (SPEC §7): plain functions of a loaded run, one module per rule.

    from stepscope.analysis.rules import evaluate
    result = evaluate(run, {"GetNextBottleneck": {"threshold": 0.3}})
    result["findings"], result["not_applicable"]

Thresholds and their defaults are in docs/rules.md (generated from the Param
declarations of each rule). Rules that need GPU data (LowGPUUtilization,
CPUBottleneck, IOBottleneck, BatchSize, GPUMemoryIncrease, KernelLaunchBound,
HostSyncStall) come with the GPU integration.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from stepscope.analysis.rules.balance import LoadBalancing
from stepscope.analysis.rules.base import Finding, Param, Rule
from stepscope.analysis.rules.getnext import GetNextBottleneck
from stepscope.analysis.rules.init import MaxInitializationTime
from stepscope.analysis.rules.memory import HostMemoryIncrease
from stepscope.analysis.rules.outlier import StepOutlier

RULES: List[Rule] = [GetNextBottleneck(), StepOutlier(), HostMemoryIncrease(), MaxInitializationTime(),
                     LoadBalancing()]
BY_NAME = {r.name: r for r in RULES}


class ParamError(ValueError):
    pass


def parse_params(items: List[str]) -> Dict[str, Dict[str, float]]:
    """["Rule.param=value", ...] -> {rule: {param: value}}, with clear errors."""
    out: Dict[str, Dict[str, float]] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        rule, dot, param = key.strip().partition(".")
        if not sep or not dot:
            raise ParamError(f"--param {item!r}: expected Rule.param=value")
        if rule not in BY_NAME:
            raise ParamError(f"--param {item!r}: unknown rule {rule!r}; rules: {', '.join(BY_NAME)}")
        if param not in BY_NAME[rule].params:
            raise ParamError(f"--param {item!r}: {rule} has no parameter {param!r}; "
                             f"parameters: {', '.join(BY_NAME[rule].params)}")
        try:
            out.setdefault(rule, {})[param] = float(value)
        except ValueError:
            raise ParamError(f"--param {item!r}: {value!r} is not a number") from None
    return out


def evaluate(run, overrides: Optional[Dict[str, Dict[str, float]]] = None) -> dict:
    """Runs every applicable rule. Returns findings, not_applicable reasons and the parameters used."""
    overrides = overrides or {}
    findings: List[Finding] = []
    skipped, used = {}, {}
    for rule in RULES:
        params = {k: v.default for k, v in rule.params.items()}
        params.update(overrides.get(rule.name, {}))
        used[rule.name] = params
        reason = rule.not_applicable(run)
        if reason:
            skipped[rule.name] = reason
            continue
        findings.extend(rule.evaluate(run, params))
    return {"findings": [f.as_dict() for f in findings], "not_applicable": skipped, "params": used}


__all__ = ["RULES", "Finding", "Param", "ParamError", "Rule", "evaluate", "parse_params"]
