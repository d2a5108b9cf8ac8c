"""SageMaker Debugger's rule configurations, translated to stepscope's parameters.

Debugger's profiler rules (smdebug_rulesconfig.profiler_rules) take thresholds in
percent, minutes, and counts of samples (``patience``, ``window``). stepscope's
parameters are seconds, percent, ratios and steps (SPEC §7), so a Debugger name is
accepted on ``--param`` and translated when the rules run: counts of samples with
the run's sampling interval (run.json ``config.interval_ms``), and into steps with
the run's median train step time. A Debugger name without a faithful translation
is refused with one line naming the stepscope parameter to use instead.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

# kind of translation -> how it reads in docs/rules.md
KINDS = {
    "same": "same value",
    "percent_to_ratio": "percent / 100",
    "minutes_to_s": "minutes x 60",
    "samples_to_s": "samples x the run's sampling interval",
    "samples_to_steps": "samples x the run's sampling interval / the median train step time, rounded up",
    "ignore_n": "+ 1 (Debugger ignored this many outliers; stepscope counts the ones that fire)",
    "scan": "no effect on a finished run; `stepscope watch` reads it as `--every`",
}

_SCAN = ("scan_interval_us", None, "scan")
# rule -> [(Debugger parameter, stepscope parameter, kind)]; defaults are Debugger's
TRANSLATIONS: Dict[str, List[Tuple[str, Optional[str], str]]] = {
    "BatchSize": [("cpu_threshold_p95", "max_cpu", "same"), ("gpu_threshold_p95", "gpu_threshold", "same"),
                  ("gpu_memory_threshold_p95", "max_gpu_memory", "same"),
                  ("patience", "warmup_steps", "samples_to_steps"), ("window", "window_s", "samples_to_s"), _SCAN],
    "CPUBottleneck": [("threshold", "min_share", "percent_to_ratio"),
                      ("patience", "warmup_steps", "samples_to_steps"), _SCAN],
    "IOBottleneck": [("threshold", "min_share", "percent_to_ratio"), ("io_threshold", "min_iowait", "same"),
                     ("patience", "warmup_steps", "samples_to_steps"), _SCAN],
    "Dataloader": [("min_threshold", "min_cores_percent", "same"), ("max_threshold", "max_cores_percent", "same"),
                   _SCAN],
    "GPUMemoryIncrease": [("increase", "min_increase_percent", "same"),
                          ("patience", "warmup_steps", "samples_to_steps"), _SCAN],
    "LoadBalancing": [("threshold", "gpu_imbalance_ratio", "same"), ("patience", "warmup_steps", "samples_to_steps"),
                      _SCAN],
    "LowGPUUtilization": [("threshold_p95", "fluctuation_p95", "same"), ("threshold_p5", "fluctuation_p5", "same"),
                          ("window", "window_s", "samples_to_s"), ("patience", "warmup_steps", "samples_to_steps"),
                          _SCAN],
    "MaxInitializationTime": [("threshold", "threshold_s", "minutes_to_s"), _SCAN],
    "OverallSystemUsage": [_SCAN],
    "OverallFrameworkMetrics": [_SCAN],
    "StepOutlier": [("stddev", "mad_multiple", "same"), ("n_outliers", "min_outliers", "ignore_n"), _SCAN],
    "ProfilerReport": [_SCAN],
}

# Debugger names refused, each with the stepscope parameter that does the job.
REFUSED = {
    ("GPUMemoryIncrease", "window"): "Debugger's window counts samples of a moving average; stepscope compares "
                                     "the first and last share of the steady state: use "
                                     "GPUMemoryIncrease.window_share (a ratio)",
}

# Debugger's model rules read saved tensors, which stepscope does not record.
MODEL_RULES = ("VanishingGradient", "SimilarAcrossRuns", "WeightUpdateRatio", "AllZero", "ExplodingTensor",
               "UnchangedTensor", "LossNotDecreasing", "CheckInputImages", "DeadRelu", "Confusion", "TreeDepth",
               "ClassImbalance", "Overfit", "TensorVariance", "Overtraining", "PoorWeightInitialization",
               "SaturatedActivation", "NLPSequenceRatio", "StalledTrainingRule", "FeatureImportanceOverweight",
               "CreateXgboostReport")

# StepOutlier.mode: Debugger's mode names (smdebug ModeKeys) and plain words
MODE_WORDS = {"train": "train", "training": "train", "modekeys.train": "train",
              "eval": "eval", "evaluation": "eval", "validation": "eval", "modekeys.eval": "eval",
              "predict": "predict", "prediction": "predict", "inference": "predict", "modekeys.predict": "predict",
              "all": "all", "none": "all", "global": "all", "modekeys.global": "all", "": "all"}


def lookup(rule: str, param: str) -> Optional[Tuple[Optional[str], str]]:
    """(stepscope parameter or None, kind) for a Debugger parameter of a rule; None if not one."""
    for name, target, kind in TRANSLATIONS.get(rule, ()):
        if name == param:
            return target, kind
    return None


def normalize(rule: str, param: str, text: str) -> str:
    """Debugger's spelling of a non-numeric value, as stepscope's word."""
    if rule == "StepOutlier" and param == "mode":
        return MODE_WORDS.get(str(text).strip().lower(), text)
    return text


def _interval_s(run) -> float:
    ms = ((run.info or {}).get("config") or {}).get("interval_ms")
    if isinstance(ms, (int, float)) and ms > 0:
        return ms / 1000.0
    system = run.system
    if len(system):  # a run without run.json: the samples' own spacing
        t = system["timestamp_ns"].drop_duplicates().sort_values().diff().dropna()
        if len(t):
            return float(t.median()) / 1e9
    return 0.1


def _step_s(run) -> Optional[float]:
    steps = run.steps
    train = steps[steps["mode"] == "train"] if len(steps) else steps
    return float(train["duration_ns"].median()) / 1e9 if len(train) else None


def translate(run, overrides: Dict[str, dict]) -> Tuple[Dict[str, dict], List[str]]:
    """Debugger parameters in ``overrides`` turned into stepscope's, with the run's interval
    and step time; returns (overrides, one line per translation). A stepscope name given
    alongside a Debugger one wins."""
    out: Dict[str, dict] = {}
    notes: List[str] = []
    for rule, params in (overrides or {}).items():
        native = {}
        translated = {}
        for name, value in params.items():
            found = lookup(rule, name)
            if found is None or found[0] == name:
                native[name] = value
                continue
            target, kind = found
            if kind == "scan":
                notes.append(f"{rule}.{name}={value:g}: how often Debugger scanned its files; "
                             f"no effect here (stepscope watch --every)")
                continue
            v = float(value)
            if kind == "percent_to_ratio":
                new, how = v / 100.0, f"{v:g}% as a ratio"
            elif kind == "minutes_to_s":
                new, how = v * 60.0, f"{v:g} min"
            elif kind == "samples_to_s":
                iv = _interval_s(run)
                new, how = v * iv, f"{v:g} samples x {iv * 1e3:g} ms sampling interval"
            elif kind == "samples_to_steps":
                iv, step = _interval_s(run), _step_s(run)
                if not step:
                    notes.append(f"{rule}.{name}={v:g}: no train steps to convert samples into; ignored")
                    continue
                new = float(math.ceil(v * iv / step))
                how = f"{v:g} samples x {iv * 1e3:g} ms = {v * iv:g} s at a median train step of {step * 1e3:.3g} ms"
            elif kind == "ignore_n":
                new, how = v + 1, f"more than {v:g} outliers"
            else:
                new, how = value, "same meaning"
            translated[target] = new
            shown = f"{new:g}" if isinstance(new, float) else str(new)
            notes.append(f"{rule}.{name}={value if isinstance(value, str) else format(v, 'g')} -> "
                         f"{target}={shown} ({how})")
        out[rule] = {**translated, **native}
    return out, notes


def translation_markdown() -> List[str]:
    """The translation table of docs/rules.md."""
    lines = ["## SageMaker Debugger's rule configurations", "",
             "`--param` accepts SageMaker Debugger's rule names and parameter names (case-insensitive rule names, "
             "as Debugger's ProfilerReport did) and translates them when the rules run; the summary lists each "
             "translation under `param_translations` (and in its text). Debugger counted some parameters in "
             "samples of its system monitor: those become seconds with the run's sampling interval "
             "(`STEPSCOPE_INTERVAL_MS`, run.json `config.interval_ms`), and steps with the run's median train step "
             "time. `ProfilerReport.<Rule>_<param>=value` (Debugger's ProfilerReport keys) is the same as "
             "`<Rule>.<param>=value`. A stepscope name given beside a Debugger one wins.", "",
             "| Debugger parameter | stepscope parameter | translation |", "| --- | --- | --- |"]
    for rule, rows in TRANSLATIONS.items():
        for name, target, kind in rows:
            lines.append(f"| `{rule}.{name}` | {f'`{target}`' if target else '-'} | {KINDS[kind]} |")
    for (rule, name), why in REFUSED.items():
        lines.append(f"| `{rule}.{name}` | refused | {why} |")
    lines += ["", "Debugger parameters whose name stepscope shares keep stepscope's meaning (with Debugger's "
              "meaning where they match): `CPUBottleneck.gpu_threshold`, `CPUBottleneck.cpu_threshold`, "
              "`IOBottleneck.gpu_threshold`, `StepOutlier.mode` (`training`, `TRAIN`, `ModeKeys.TRAIN`, `eval`, "
              "`validation`, `predict`, `None`/`all`). Debugger's defaults are not stepscope's: Debugger's "
              "CPU and I/O rules called a GPU underused below 10%, stepscope's window rules below 50% "
              "(`gpu_threshold`).", "",
             "Debugger's model rules (" + ", ".join(f"`{r}`" for r in MODEL_RULES) + ") read saved tensors, "
             "which a profiler does not record: naming one is an error that says so.", ""]
    return lines
