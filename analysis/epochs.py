"""The time a Keras fit spends between its epochs' steps (SPEC §3): validation
start-up and epoch end, named by the framework spans the Keras callback records
(``keras.validation_start``, ``keras.epoch_end``; docs/design.md)."""

from __future__ import annotations

from typing import Optional

from stepscope.analysis.quantities import ms

VALIDATION_START, EPOCH_END = "keras.validation_start", "keras.epoch_end"
PARTS = {VALIDATION_START: "validation start-up", EPOCH_END: "epoch end (callbacks, checkpointing, next epoch's start)"}


def between_epochs(run) -> Optional[dict]:
    """{"epochs", "per_epoch_ms", "total_ms", "parts": {what: ms per epoch}}, or None."""
    spans = run.select(categories=["framework"], names=list(PARTS), columns=["name", "start_ns", "end_ns"])
    if not len(spans):
        return None
    epochs = max(int((spans["name"] == EPOCH_END).sum()), 1)
    cost = spans.assign(ns=spans["end_ns"] - spans["start_ns"]).groupby("name", observed=True)["ns"].sum()
    parts = {PARTS[name]: ms(float(ns) / epochs) for name, ns in cost.items()}
    return {"epochs": epochs, "per_epoch_ms": ms(float(cost.sum()) / epochs), "total_ms": ms(float(cost.sum())),
            "parts": parts}


def format_line(b: dict) -> str:
    parts = ", ".join(f"{what} {v:.1f} ms" for what, v in b["parts"].items())
    return (f"  between epochs {b['per_epoch_ms']:.1f} ms per epoch over {b['epochs']} epoch(s), "
            f"in no step: {parts}")
