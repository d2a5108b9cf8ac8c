"""Where each thread's training loop is: steps belong to the thread that runs
the loop (SPEC §3), so two loops in two threads (a ``ThreadPoolExecutor``
training two models) are two sequences of steps, each with its own tracker,
nesting depth and open forwards.

Each thread's state is ``loops.local.s`` (a ``threading.local``). The native
wrappers (``csrc/torch/record_function.cc``, ``csrc/torch/roots.cc``) and the optimizer hooks find it
through ``_native_hooks.loop_state(local)``, which caches it per OS thread, and read
its fields in C. The ``local`` is kept for the process's life: a forked child
gets a new state in it (and the cache is told), not a new ``local``.
"""

from __future__ import annotations

import threading
from typing import Callable, List, Tuple

from stepscope.integrations._steps import StepTracker
from stepscope.integrations.torch import _native_hooks


_FOREIGN = getattr(threading, "_DummyThread", ())  # threading's stand-in for threads it did not start


# One thread's place in its loop: depth, in_backward, in_optimizer, stack,
# forced_modes, iter_started, setting_mode, pending_root, tracker
# (and the native-only optimizer_t0, fetch_t0, zero_grad_t0). A C struct (csrc/torch/loop.h): the
# native wrappers on every step read and set it without attribute lookups.
LoopState = _native_hooks.LoopState


PREFETCHED = ("DataLoader batches were read in a background thread (a prefetcher such as "
              "prefetch_generator's BackgroundGenerator): the training loop's wait for them is in Other, "
              "not GetNext")


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
        _native_hooks.loop_states_changed()  # the native cache of each thread's local.s

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
        return _native_hooks.loop_state(self.local)

    def close_all(self) -> None:
        """Closes every thread's open step (session end): another thread's step
        ends where its work ended, marked for that thread."""
        me = threading.get_native_id()
        with self.lock:
            states = list(self.states)
        for tid, state in states:
            state.tracker.close(0 if tid == me else tid)
        if any(s.tracker.prefetched and not s.tracker.worked for _, s in states):
            from stepscope.core import session

            session.add_note(PREFETCHED)

    def reset(self) -> None:
        """A forked child: it inherits no loop of its parent's threads (its one
        thread gets a fresh state; the native wrappers hold ``local``)."""
        self.lock = threading.Lock()
        self.states = []
        self.local.s = self._new_state()
        _native_hooks.loop_states_changed()
