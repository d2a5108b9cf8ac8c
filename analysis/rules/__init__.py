"""Bottleneck rules (SPEC §7): plain functions of a loaded run, one module per rule.

    from stepscope.analysis.rules import evaluate
    result = evaluate(run, {"GetNextBottleneck": {"threshold": 0.3}})
    result["findings"], result["not_applicable"], result["details"]

Thresholds and their defaults are in docs/rules.md (generated from the Param
declarations of each rule). Rules that need GPU data (LowGPUUtilization,
CPUBottleneck, IOBottleneck, BatchSize, GPUMemoryIncrease from NVML samples;
KernelLaunchBound, HostSyncStall from CUPTI's activity trace) are not
applicable to a run without it. Custom rules join through ``registry``;
SageMaker Debugger's parameter names through ``debugger``.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from stepscope.analysis.rules import debugger, registry
from stepscope.analysis.rules.balance import LoadBalancing
from stepscope.analysis.rules.base import (MIN_TOTAL_S, SEVERITIES, Finding, Param, Rule, cost_floor_ms, negligible,
                                          saving_from_cost, total_cost_s)
from stepscope.analysis.rules.batchsize import BatchSize
from stepscope.analysis.rules.communication import CommunicationBound
from stepscope.analysis.rules.compile import CompileTime, GraphBreak, Recompilation, Retracing
from stepscope.analysis.rules.cpu import CPUBottleneck
from stepscope.analysis.rules.dataloader import Dataloader
from stepscope.analysis.rules.docs import rules_markdown
from stepscope.analysis.rules.getnext import GetNextBottleneck
from stepscope.analysis.rules.gpumemory import GPUMemoryIncrease
from stepscope.analysis.rules.hostsync import HostSyncStall
from stepscope.analysis.rules.init import MaxInitializationTime
from stepscope.analysis.rules.io import IOBottleneck
from stepscope.analysis.rules.launch import KernelLaunchBound
from stepscope.analysis.rules.lowgpu import LowGPUUtilization
from stepscope.analysis.rules.memory import HostMemoryIncrease
from stepscope.analysis.rules.outlier import StepOutlier
from stepscope.analysis.rules.overall import OverallFrameworkMetrics, OverallSystemUsage, ProfilerReport
from stepscope.analysis.rules.params import ParamError, parse_params
from stepscope.analysis.rules.registry import RuleLoadError, load_spec, register
from stepscope.analysis.rules.relate import relate

RULES: List[Rule] = [GetNextBottleneck(), StepOutlier(), HostMemoryIncrease(), MaxInitializationTime(),
                     LoadBalancing(), LowGPUUtilization(), CPUBottleneck(), IOBottleneck(), BatchSize(),
                     GPUMemoryIncrease(), KernelLaunchBound(), HostSyncStall(), CommunicationBound(), Recompilation(),
                     GraphBreak(), Retracing(), CompileTime(),
                     Dataloader(),
                     OverallSystemUsage(), OverallFrameworkMetrics(), ProfilerReport()]
BY_NAME = {r.name: r for r in RULES}  # the built-in rules; registry.by_name() adds custom ones
registry.set_builtin(RULES)


def evaluate(run, overrides: Optional[Dict[str, Dict[str, object]]] = None) -> dict:
    """Runs every applicable rule (built-in and custom). Returns findings (one per problem,
    none whose cost per step is negligible: ``below_cost_floor`` lists those),
    related_findings (those another finding explains, each with ``related_to``: relate.py),
    not_applicable reasons, the parameters used, rules' details, Debugger parameter
    translations and warnings (a custom rule that failed)."""
    overrides, translations = debugger.translate(run, overrides or {})
    findings: List[Finding] = []
    below_floor: List[dict] = []  # negligible findings (base.negligible): not findings, listed for the record
    skipped, used, details, counts = {}, {}, {}, {}
    warnings = list(registry.load_errors)
    builtin = set(BY_NAME)
    for rule in registry.all_rules():
        given = dict(overrides.get(rule.name, {}))
        severity = given.pop("severity", None)
        params = {k: v.default for k, v in rule.params.items()}
        params.update(given)
        used[rule.name] = {**params, **({"severity": severity} if severity else {})}
        try:
            reason = rule.not_applicable(run)
            if reason:
                skipped[rule.name] = reason
                continue
            found = list(rule.evaluate(run, params))
            unjudged = None if found else rule.why_not_judged(run, params)
            d = rule.details(run, params)
        except Exception as exc:  # a custom rule's bug must not hide the others' findings
            if rule.name in builtin:
                raise
            skipped[rule.name] = f"failed: {type(exc).__name__}: {exc}"
            warnings.append(f"custom rule {rule.name} failed: {type(exc).__name__}: {exc}")
            continue
        below_floor += [{"rule": f.rule, "rank": f.rank, "cost_ms_per_step": round(float(f.cost_ms_per_step), 4),
                         "floor_ms": round(cost_floor_ms(run, f), 4), "total_s": round(total_cost_s(run, f), 3),
                         "floor_total_s": MIN_TOTAL_S} for f in found if negligible(run, f)]
        found = [f for f in found if not negligible(run, f)]
        for f in found:
            if f.saving is None:
                f.saving = saving_from_cost(run, f)
            if severity:
                f.severity = severity
            elif f.severity not in SEVERITIES:
                f.severity = "warning"
        if unjudged:
            skipped[rule.name] = unjudged
        findings.extend(found)
        counts[rule.name] = len(found)
        if d:
            details[rule.name] = d
    primary, related = relate(run, findings, used)
    result = {"findings": [f.as_dict() for f in primary], "related_findings": [f.as_dict() for f in related],
              "not_applicable": skipped, "params": used, "details": details, "translations": translations,
              "warnings": warnings, "below_cost_floor": below_floor}
    if ProfilerReport.name in used and ProfilerReport.name not in skipped:
        details[ProfilerReport.name] = ProfilerReport.table(result, counts)
    return result


__all__ = ["RULES", "SEVERITIES", "Finding", "Param", "ParamError", "Rule", "RuleLoadError", "evaluate",
           "load_spec", "parse_params", "register", "rules_markdown"]
