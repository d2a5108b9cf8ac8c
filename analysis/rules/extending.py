"""The parts of docs/rules.md about using rules: custom rules, CI gates, rules while a job runs."""

from __future__ import annotations

from typing import List


def extending_markdown() -> List[str]:
    return [
        "## Custom rules", "",
        "A custom rule is written like the built-in ones: a subclass of `stepscope.analysis.rules.Rule` with "
        "the class attributes `name`, `summary` and `params` (`{name: Param(default, unit, doc)}`, in seconds, "
        "milliseconds, percent, ratios or steps; `Param(..., choices=(...))` for a word), a "
        "`not_applicable(run)` that returns why a run lacks its data (or None), and `evaluate(run, p)` returning "
        "`Finding(rule, severity, message, recommendation, evidence, rank)`s; `details(run, p)` may return "
        "figures for `rule_details`. `run` is what `stepscope.load` returns, `p` the parameters as used "
        "(defaults with `--param` overrides). `examples/custom_rule.py` is one.", "",
        "Two ways to load one, for `stepscope summary`, `report`, `diff` and `watch` alike:", "",
        "- `--rules module:Class` (also `module:A,B`, or `module` for its `RULES` list), the module importable "
        "(on `PYTHONPATH` or in the current folder). `--param Class.param=value` then sets its parameters.",
        "- an installed package's entry point in the group `stepscope.rules`, loaded by every command: "
        "`[project.entry-points.\"stepscope.rules\"]` with `my_rule = \"my_package.rules:MyRule\"` (a Rule "
        "subclass, an instance, or a list of them). A plugin that fails to load is listed under the summary's "
        "`warnings` and the other rules run.", "",
        "A custom rule cannot take a built-in rule's name; a `--rules` rule replaces an entry point's of the "
        "same name. A custom rule that raises is reported under `rules_not_applicable` (`failed: ...`) and "
        "`warnings`; the other rules' findings stand. From Python: "
        "`stepscope.analysis.rules.register(MyRule)`.", "",
        "## Gating CI", "",
        "Findings carry a `severity`: `info`, `warning` (every built-in rule's findings) or `error` (custom "
        "rules may use it). `--param Rule.severity=error` (or `info`) sets a rule's findings' severity, so a "
        "CI job decides which rules break the build.", "",
        "- `stepscope summary RUN --fail-on WARN` exits 1 when a finding has severity warning or error; "
        "`--fail-on ERROR` only for errors. The summary is printed either way (stdout), the reason on stderr.",
        "- `stepscope diff BASELINE RUN --fail-on WARN|ERROR [--max-regression PCT]` exits 1 on a step-time "
        "regression: a mode's median step time in RUN more than PCT percent (default 10) above the baseline's "
        "(listed under `regressions`, severity error, so both levels gate on it); and on findings of rules "
        "that did not fire on the baseline (`new_findings`) at or above the level. The median keeps one slow "
        "checkpoint step from failing the build; compare runs of the same length and batch size.", "",
        "Exit 2 is still bad input (an unknown rule or parameter, a run that cannot be read).", "",
        "## Rules while the job runs", "",
        "`stepscope watch RUN [--every 60s] [--exec CMD] [--timeout T] [--json] [--param ...] [--rules ...]` "
        "evaluates the rules on what the run has flushed so far (each process's writer flushes every second) "
        "every `--every` (`60`, `60s`, `500ms`, `2m`; default 60 s, or the smallest Debugger `scan_interval_us` "
        "given), prints each finding once, when it first appears (a finding is the same while its rule, rank, "
        "process, node, GPU and mode are; its figures may grow), and runs `--exec CMD` (alias `--on-finding`) "
        "through the shell once per new finding with the finding as JSON on stdin (`STEPSCOPE_FINDING_RULE` "
        "and `STEPSCOPE_WATCH_RUN` in its environment): Debugger's rule actions, such as stopping the job "
        "(`--exec 'kill $(cat train.pid)'`) or notifying someone. RUN may not exist yet: watch waits up to a "
        "minute for the job to create it.", "",
        "Watching ends, after one last evaluation, when the run ends (run.json gets `end_time` when the "
        "process that started the run stops), or when every process of the run on this host has exited "
        "without closing it (killed); on Ctrl-C (exit 130); or after `--timeout` (exit 0). Rules judge the "
        "steps recorded so far: early on, StepOutlier and the memory rules have fewer steps to go on than "
        "they will at the end.", ""]
