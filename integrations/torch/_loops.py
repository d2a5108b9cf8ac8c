"""Where each thread's training loop is: steps belong to the thread that runs
the loop (SPEC §3), so two loops in two threads (a ``ThreadPoolExecutor``
training two models) are two sequences of steps, each with its own tracker,
nesting depth and open forwards.

The hooks read one attribute per call (``loops.local.s``): a ``threading.local``
lookup, then plain slots. The native range wrappers (``csrc/hooks.cc``) read
and set ``depth``, ``iter_started``, ``fetch_t0``, ``zero_grad_t0`` and
``tracker`` by name, through the same ``local``: it is kept for the process's
life (a forked child gets a new state in it, not a new ``local``).
"""

from __future__ import annotations

import threading
from typing import Callable, List, Tuple

from stepscope.integrations._steps import StepTracker


_FOREIGN = getattr(threading, "_DummyThread", ())  # threading's stand-in for threads it did not start


class LoopState:
    """One thread's place in its loop."""

    __slots__ = ("depth", "in_backward", "in_optimizer", "stack", "forced_modes", "optimizer_t0",
                 "iter_started", "fetch_t0", "zero_grad_t0", "setting_mode", "pending_root", "tracker")

    def __init__(self, tracker: StepTracker):
        self.depth = 0  # root forwards (or a fetch) in progress: nested work is theirs
        self.in_backward = 0
        self.in_optimizer = 0
        self.stack: list = []  # (t0, mode, phase) of open root forwards
        self.forced_modes: list = []  # a framework loop that knows its mode (Keras fit/evaluate/predict)
        self.optimizer_t0 = 0
        self.iter_started = None  # tick: DataLoader.__iter__ began, no fetch since
        self.fetch_t0 = 0  # tick: the outermost fetch in progress began (csrc/hooks.cc)
        self.zero_grad_t0 = 0  # tick: an optimizer's zero_grad in progress began (csrc/hooks.cc)
        self.setting_mode = False  # inside Module.train(): its children's calls are its own
        self.pending_root = None  # a module whose first call is timed by the discovery post-hook
        self.tracker = tracker


def _never() -> bool:
    return False


class _PerThread(threading.local):
    def __init__(self, loops: "Loops"):
        self.s = loops._new_state()


class Loops:
    """The loop state of every thread that ran a hook."""

    def __init__(self, make_tracker: Callable[[], StepTracker]):
        self.make_tracker = make_tracker
        self.lock = threading.Lock()
        self.states: List[Tuple[int, LoopState]] = []  # (native thread id, state)
        self.local = _PerThread(self)

    def _new_state(self) -> LoopState:
        tracker = self.make_tracker()
        here = threading.current_thread()
        # Only the main thread's fetches make steps before any work shows: a thread
        # that only reads batches (a prefetching thread) runs no loop of its own.
        tracker.background = here is not threading.main_thread()
        state = LoopState(tracker)
        if isinstance(here, _FOREIGN):
            # A thread Python did not start: the autograd engine's device threads run
            # backward on GPUs, and with it checkpointing's recomputed forwards and an
            # optimizer stepped from a gradient hook. Never a loop of its own: its
            # forwards are Recompute, its phases go to the loop's steps by time.
            state.in_backward = 1
            tracker.may_begin = _never
        with self.lock:
            self.states.append((threading.get_native_id(), state))
        return state

    @property
    def here(self) -> LoopState:
        return self.local.s

    def close_all(self) -> None:
        """Closes every thread's open step (session end): another thread's step
        ends where its work ended, marked for that thread."""
        me = threading.get_native_id()
        with self.lock:
            states = list(self.states)
        for tid, state in states:
            state.tracker.close(0 if tid == me else tid)

    def reset(self) -> None:
        """A forked child: it inherits no loop of its parent's threads (its one
        thread gets a fresh state; the native wrappers hold ``local``)."""
        self.lock = threading.Lock()
        self.states = []
        self.local.s = self._new_state()
