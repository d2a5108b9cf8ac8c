"""The time a Keras fit spends between its epochs' steps (SPEC §3): validation
start-up and epoch end, named by the framework spans the Keras callback records
(``keras.validation_start``, ``keras.epoch_end``; docs/design.md)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from stepscope.analysis.quantities import ms

VALIDATION_START, EPOCH_END = "keras.validation_start", "keras.epoch_end"
PARTS = {VALIDATION_START: "validation start-up", EPOCH_END: "epoch end (callbacks, checkpointing, next epoch's start)"}


def between_epochs(run) -> Optional[dict]:
    """{"epochs", "per_epoch_ms", "total_ms", "parts": {what: ms per epoch}}, or None."""
    spans = run.select(categories=["framework"], names=list(PARTS),
                       columns=["process", "name", "start_ns", "end_ns"])
    if not len(spans):
        return None
    epochs = max(int((spans["name"] == EPOCH_END).sum()), 1)
    cost = spans.assign(ns=_outside_steps(spans, run.steps)).groupby("name", observed=True)["ns"].sum()
    parts = {PARTS[name]: ms(float(ns) / epochs) for name, ns in cost.items()}
    return {"epochs": epochs, "per_epoch_ms": ms(float(cost.sum()) / epochs), "total_ms": ms(float(cost.sum())),
            "parts": parts}


def _outside_steps(spans, steps) -> np.ndarray:
    """Each span's time in no step of its process (on torch an interval is closed at the
    next batch's hook, after that step began at its fetch)."""
    out = (spans["end_ns"] - spans["start_ns"]).to_numpy(dtype=np.int64).copy()
    for i, (process, a, b) in enumerate(zip(spans["process"].astype(str), spans["start_ns"], spans["end_ns"])):
        s = steps[steps["process"].astype(str) == process]
        overlap = np.minimum(s["end_ns"].to_numpy(), b) - np.maximum(s["start_ns"].to_numpy(), a)
        out[i] = max(0, out[i] - int(overlap[overlap > 0].sum()))
    return out


def format_line(b: dict) -> str:
    parts = ", ".join(f"{what} {v:.1f} ms" for what, v in b["parts"].items())
    return (f"  between epochs {b['per_epoch_ms']:.1f} ms per epoch over {b['epochs']} epoch(s), "
            f"in no step: {parts}")
