"""``--param Rule.param=value``: stepscope's names, SageMaker Debugger's names
(debugger.py), a ``severity`` for every rule, each refusal one line that says what to
use instead."""

from __future__ import annotations

from typing import Dict, List

from stepscope.analysis.rules import debugger
from stepscope.analysis.rules.base import SEVERITIES, Param
from stepscope.analysis.rules.registry import by_name

#: Every rule takes it: the severity its findings are given (for --fail-on).
SEVERITY = Param("", "", "the severity of this rule's findings (`info`, `warning`, `error`): `--fail-on` gates "
                         "on it", choices=SEVERITIES)


class ParamError(ValueError):
    pass


def _rule_name(rule: str, rules: dict, item: str) -> str:
    if rule in rules:
        return rule
    folded = {r.lower(): r for r in rules}
    if rule.lower() in folded:  # Debugger's ProfilerReport took rule names in any case
        return folded[rule.lower()]
    model = {r.lower(): r for r in debugger.MODEL_RULES}
    if rule.lower() in model:
        raise ParamError(f"--param {item!r}: {model[rule.lower()]} is a SageMaker Debugger model rule on saved "
                         f"tensors; stepscope records time and resources, not tensors, and has no equivalent")
    raise ParamError(f"--param {item!r}: unknown rule {rule!r}; rules: {', '.join(rules)}")


def parse_one(rule: str, param: str, value: str, item: str, rules: dict, out: Dict[str, dict]) -> None:
    if rule == "ProfilerReport" and "_" in param and param != "scan_interval_us":
        # Debugger's ProfilerReport keys: <rule_name>_<parameter_name>
        inner, _, inner_param = param.partition("_")
        return parse_one(_rule_name(inner, rules, item), inner_param, value, item, rules, out)
    prm = rules[rule].params.get(param)
    if param == "severity":
        prm = SEVERITY
    if prm is None:
        refused = debugger.REFUSED.get((rule, param))
        if refused:
            raise ParamError(f"--param {item!r}: {refused}")
        if debugger.lookup(rule, param) is None:
            raise ParamError(f"--param {item!r}: {rule} has no parameter {param!r}; "
                             f"parameters: {', '.join(list(rules[rule].params) + _debugger_names(rule))}")
        prm = Param(0.0, "", "")  # a Debugger parameter: a number, translated when the rules run
    try:
        parsed = prm.parse(debugger.normalize(rule, param, value))
    except ValueError as exc:
        raise ParamError(f"--param {item!r}: {exc}") from None
    out.setdefault(rule, {})[param] = parsed


def _debugger_names(rule: str) -> List[str]:
    return [f"{name} (Debugger)" for name, _, _ in debugger.TRANSLATIONS.get(rule, ())]


def parse_params(items: List[str]) -> Dict[str, Dict[str, object]]:
    """["Rule.param=value", ...] -> {rule: {param: value}}, with clear errors."""
    rules = by_name()
    out: Dict[str, Dict[str, object]] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        rule, dot, param = key.strip().partition(".")
        if not sep or not dot:
            raise ParamError(f"--param {item!r}: expected Rule.param=value")
        parse_one(_rule_name(rule, rules, item), param.strip(), value, item, rules, out)
    return out
