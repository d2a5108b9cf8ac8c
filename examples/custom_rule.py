"""A custom stepscope rule: a budget for the median train step time.

    stepscope summary RUN --rules custom_rule:StepTimeBudget --param StepTimeBudget.max_median_ms=50
    stepscope summary RUN --rules custom_rule:StepTimeBudget --fail-on ERROR     # a CI gate

(run from this folder, or with it on PYTHONPATH). A package can ship it instead
under the ``stepscope.rules`` entry-point group, and every stepscope command then
runs it without ``--rules``:

    [project.entry-points."stepscope.rules"]
    step_time_budget = "custom_rule:StepTimeBudget"

A rule is a ``Rule`` subclass with a ``name``, a ``summary`` and ``params``
(``Param(default, unit, doc)``, in seconds, milliseconds, percent or ratios);
``not_applicable(run)`` says why a run lacks its data, ``evaluate(run, p)`` returns
``Finding``s. ``run`` is what ``stepscope.load`` returns (``run.steps``,
``run.phases``, ``run.system``, ``run.kernels``...), ``p`` the parameters as used.
"""

from stepscope.analysis.rules import Finding, Param, Rule


class StepTimeBudget(Rule):
    name = "StepTimeBudget"
    summary = "The median train step takes longer than the budget."
    params = {"max_median_ms": Param(100.0, "ms", "fire when the median train step is longer than this")}

    def not_applicable(self, run):
        return None if (run.steps["mode"] == "train").any() else "no train steps"

    def evaluate(self, run, p):
        train = run.steps[run.steps["mode"] == "train"]
        median_ms = float(train["duration_ns"].median()) / 1e6
        if median_ms <= p["max_median_ms"]:
            return []
        return [Finding(rule=self.name, severity="error",
                        message=f"the median train step takes {median_ms:.1f} ms, over the "
                                f"{p['max_median_ms']:g} ms budget",
                        recommendation="Compare with the last good run: stepscope diff GOOD_RUN THIS_RUN.",
                        evidence={"median_ms": round(median_ms, 3), "steps": int(len(train))})]
