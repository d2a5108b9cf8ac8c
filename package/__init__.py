"""stepscope: what is your training job doing with its hardware?

    with stepscope.profile() as run:       # or STEPSCOPE=1 python train.py
        for batch in loader:
            stepscope.step()
            with stepscope.annotate("forward"):
                ...
    tables = stepscope.load(run.path)

Importing stepscope never imports torch, tensorflow, keras or lightning.
"""

from stepscope.core import (CATEGORIES, Config, ConfigError, Session, annotate, annotation_begin,
                            annotation_end, counter, current, end_step, phase, profile, start, step,
                            stop)
from stepscope.core.session import join_parent_run_if_any as _join_parent_run_if_any
from stepscope.core.session import set_loader as _set_loader

__version__ = "0.1.0"


def load(run, **kwargs):
    """A recorded run (folder or name under STEPSCOPE_DIR) as pandas tables."""
    from stepscope.analysis import load as _load

    return _load(run, **kwargs)


__all__ = ["CATEGORIES", "Config", "ConfigError", "Session", "annotate", "annotation_begin",
           "annotation_end", "counter", "current", "end_step", "load", "phase", "profile", "start", "step",
           "stop", "__version__"]

_set_loader(load)
_join_parent_run_if_any()
