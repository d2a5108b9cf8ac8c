"""Which recorded Python stacks and samples can be read: a damaged trace may have lost
the chunk that defined a stack or a frame (the reader counts those samples as lost)."""

from __future__ import annotations

from typing import Optional

import numpy as np

UNDEFINED = 0xFFFFFFFF  # the reader's mark for a frame or stack no chunk defined (a lost chunk)


def stack_validity(py: dict) -> np.ndarray:
    """Per stack id of one process: whether the whole stack can be read (every frame and
    string it names is defined, its parents too). Damage that loses a PYSTACKS chunk
    leaves stacks pointing at entries that were never defined."""
    strings = len(py["strings"])
    ff, fl = py["frame_func"].astype(np.int64), py["frame_file"].astype(np.int64)
    parents, frames = py["stack_parent"].astype(np.int64), py["stack_frame"].astype(np.int64)
    n = len(parents)
    frame_ok = (ff < strings) & (fl < strings) & (ff >= 0) & (fl >= 0)
    own = (frames >= 0) & (frames < len(ff))
    own[own] = frame_ok[frames[own]]
    # a parent is always interned before its child: anything else is damage
    own &= (parents == -1) | ((parents >= 0) & (parents < np.arange(n)))
    ok = own.copy()
    has_parent = own & (parents >= 0)  # (own: the parent id is below the stack's own)
    while True:  # a stack is readable when its parent is: settles within the deepest stack's depth
        nxt = own.copy()
        nxt[has_parent] &= ok[parents[has_parent]]
        if np.array_equal(nxt, ok):
            return ok
        ok = nxt


def readable_samples(py: dict, valid: np.ndarray = None) -> np.ndarray:
    """Which samples of one process have a stack that can be read."""
    stack = py["stack"].astype(np.int64)
    valid = stack_validity(py) if valid is None else valid
    keep = stack < len(valid)
    keep[keep] = valid[stack[keep]]
    return keep


def lost_samples(py: Optional[dict]) -> int:
    """How many samples of one process lost their stack to damage."""
    if not py or not len(py["time"]):
        return 0
    return int((~readable_samples(py)).sum())
