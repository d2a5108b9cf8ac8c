"""The frameworks stepscope knows, each written once (pure data: imports nothing).

Whoever needs to know a framework reads it here: run.json's versions
(core/runinfo.py), the reports' display names, the architecture test's list
of modules the core may never import, and the check that pyproject.toml's
instrumentor entry points name each integration below.
"""

from __future__ import annotations

from typing import NamedTuple, Optional


class Framework(NamedTuple):
    module: str                 # its top-level import name
    distribution: str           # its distribution (where the version is read)
    display: str                # its name in reports
    integration: Optional[str]  # the stepscope.integrations package that handles it; None: none does
    # the module whose import turns the integration on (its entry point's name): the
    # framework's own unless the integration needs only a part of it
    instrument_on: Optional[str] = None
    # its integration marks training steps (the notes on a loop stepscope did not
    # understand name these frameworks); False: it only adds detail (ranges, loaders)
    marks_steps: bool = True


FRAMEWORKS = (
    Framework("torch", "torch", "PyTorch", "torch", "torch"),
    Framework("lightning", "lightning", "Lightning", "lightning", "lightning"),
    Framework("pytorch_lightning", "pytorch-lightning", "Lightning", "lightning", "pytorch_lightning"),
    Framework("tensorflow", "tensorflow", "TensorFlow", "tfdata", "tensorflow"),
    Framework("keras", "keras", "Keras", "keras", "keras"),
    Framework("jax", "jax", "JAX", None),
    # a job that only tokenizes imports no trainer: nothing is patched until it does
    Framework("transformers", "transformers", "Transformers", "transformers", "transformers.trainer"),
    Framework("accelerate", "accelerate", "Accelerate", "accelerate", "accelerate.data_loader", False),
    Framework("nvtx", "nvtx", "NVTX", "nvtx", "nvtx", False),  # other profilers' ranges (docs/design.md)
)

BY_MODULE = {f.module: f for f in FRAMEWORKS}


def display_name(module: str) -> Optional[str]:
    """A framework's name in reports ("PyTorch" for torch); None for a module not listed."""
    known = BY_MODULE.get(module)
    return known.display if known is not None else None


def step_marking_display_names(modules) -> list:
    """The display names, sorted and each once, of the frameworks among ``modules``
    whose integration marks steps."""
    return sorted({f.display for m in modules or () if (f := BY_MODULE.get(m)) is not None
                   and f.integration is not None and f.marks_steps})
