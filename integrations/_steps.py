"""From phase callbacks to contiguous steps (SPEC §3), for every framework.

Integrations report what they see -- a batch fetched, a forward, a backward,
an optimizer step -- and this tracker decides where steps begin and end:

* A step begins at the start of its iteration: the fetch of its batch when a
  data loader drives the loop, otherwise its first forward/backward/optimizer
  phase. It ends where the next one begins, or where the loader runs out.
* A train step is complete after an optimizer step, or, with no optimizer in
  the process, after a backward. An eval step is complete after a forward.
  Work after a complete train step begins a new step when the next fetch comes,
  or when an optimizer that already stepped in this step steps again (several
  optimizers per iteration in GANs; one fetch, then many optimizer steps in
  full-batch training): the new step then began where that work began.
* A fetch's mode is only known once the work on its batch shows, so a fetch
  after a complete step is held back and recorded, with the step mark at its
  start, when the next phase begins.

The tracker records through the native core with tick timestamps, so the
marks land where the step began even when it is recognised later.
"""

from __future__ import annotations

from typing import Optional, Tuple

from stepscope.core import _native
from stepscope.core import annotations as user_marks

PHASE = _native.CATEGORIES.index("phase")
GETNEXT, FORWARD, LOSS, BACKWARD, OPTIMIZER, RECOMPUTE = (_native.intern(p) for p in _native.PHASES)


class StepTracker:
    # Operator windows (integrations/torch/_ops.py): ops_step(tracker, step, at) runs when a
    # train step's number reaches ops_due; 0 while a window is open (then also step -1 where
    # an eval step begins or a loop ends). One comparison per step otherwise.
    ops_due = 1 << 62
    ops_step = None

    def __init__(self, on_new_step=None, may_begin=None):
        # on_new_step(previous_had_forward): lets an integration adapt its hooks
        self.on_new_step = on_new_step
        # may_begin(): False where this process runs no training loop of its own
        # (a DataLoader worker running transforms): nothing there is a step
        self.may_begin = may_begin
        # background: a thread other than the main one, whose fetches make steps only
        # once work (a forward, backward or optimizer step) showed in it
        self.background = False
        self.worked = False
        self.reset()

    def reset(self) -> None:
        self.suspended = False  # phases are recorded but begin no steps (Lightning's sanity check)
        self.mode: Optional[str] = None  # mode of the open step; None: between loops
        self.done = False  # the open step's work is complete
        self.fed = False  # a loader fetch began the open step: only fetches start steps
        self.pending: Optional[Tuple[int, int, str]] = None  # (t0, t1, mode) of a held-back fetch
        self.pending_more: list = []  # (t0, t1) of fetches read ahead with it, before any work
        self.mark: Optional[Tuple[str, int]] = None  # (mode, at): an eval step's mark, not yet written
        self.candidate: Optional[Tuple[int, str]] = None  # possible step start, several optimizers
        self.optimizers_in_step: set = set()
        self.optimizers_before: set = set()  # those of the previous step
        # ids of optimizers created or seen stepping: a fact of the process, kept across loops
        self.optimizers_known: set = getattr(self, "optimizers_known", set())
        self.last_end = 0  # tick: end of the last phase of the open step
        self.forward_end: Optional[int] = None  # a train forward ended and no loss was seen since
        self.forwards_in_step = 0

    # --- step boundaries ----------------------------------------------------------
    def suspend(self) -> None:
        """Stop counting steps (phases are still recorded): close the open step."""
        self.close()
        self.suspended = True

    def resume(self) -> None:
        if self.suspended:
            self.reset()

    def _begin(self, mode: str, at: int) -> None:
        if self.mode is None and self.may_begin is not None and not self.may_begin():
            self.suspended = True  # checked where a loop starts: workers run none
        if self.mode is not None and self.on_new_step is not None:
            self.on_new_step(self.forwards_in_step > 0)
        if self.mark is not None:
            self._flush_mark()
        if user_marks.by_hand:  # the program marks its own steps: phases only
            self.suspended = True
        if not self.suspended:
            if mode == "train":
                n = _native.begin_step(mode, at)
                if n >= StepTracker.ops_due:
                    StepTracker.ops_step(self, n, at)
            else:  # written when the step's mode is settled (see phase_start)
                self.mark = (mode, at)
                if not StepTracker.ops_due:
                    StepTracker.ops_step(self, -1, at)
        self.mode = mode
        self.done = False
        self.fed = False
        self.candidate = None
        self.optimizers_before, self.optimizers_in_step = self.optimizers_in_step, set()
        self.forward_end = None
        self.forwards_in_step = 0

    def _flush_mark(self) -> None:
        if self.mark is not None:
            mode, at = self.mark
            self.mark = None
            _native.begin_step(mode, at)

    def _end(self, at: int, thread: int = 0) -> None:
        """Ends the open step at ``at`` (0: now); ``thread``: the native id of the
        loop's thread when another thread ends it (at session end)."""
        if thread:
            if self.mark is None:  # an eval mark not yet written never began its step
                _native.end_step(at or _native.now(), thread)
            self.mark = None
            return
        self._flush_mark()
        if not StepTracker.ops_due:
            # An operator window open at a loop's end closes inside the step it sampled:
            # its cost (milliseconds) must not fall between two steps (SPEC §3: steps add up)
            StepTracker.ops_step(self, -1, at or _native.now())
            at = max(at, _native.now()) if at else 0
        _native.end_step(at)

    def _drop_unworked(self) -> bool:
        """A thread that only reads batches (prefetching for another thread's loop):
        its held-back fetches are no steps. True when they were dropped."""
        if not self.background or self.worked or self.pending is None:
            return False
        self.pending, self.pending_more = None, []
        return True

    def _commit_pending(self, shown: Optional[str] = None) -> None:
        """The held-back fetch begins its step; ``shown``: the mode its work shows,
        which wins over the guess made at the fetch (a loop that calls
        ``model.train()`` after fetching)."""
        t0, t1, mode = self.pending
        mode = shown or mode
        self.pending = None
        self._begin(mode, t0)
        self.fed = True
        _native.span(PHASE, GETNEXT, t0, t1)
        for t0, t1 in self.pending_more:
            _native.span(PHASE, GETNEXT, t0, t1)
        self.pending_more = []
        self.last_end = t1

    def in_step(self) -> bool:
        """A step is open (its work not over) or a fetched batch waits for its work."""
        return self.pending is not None or (self.mode is not None and not self.done)

    def phase_start(self, mode: str, now: int) -> None:
        """A forward, backward or optimizer step is starting: open the right step."""
        self.worked = True
        if self.pending is not None:
            self._commit_pending(mode)
            return
        if self.mode is None:
            self._begin(mode, now)
        elif self.done:
            if mode == "train" and self.mark is not None and self.fed:
                # Eval forwards, then train work on the same fetched batch (a teacher
                # model in eval mode, then the student): one train step.
                self.mark = ("train", self.mark[1])
                self._flush_mark()
                self.mode, self.done = "train", False
            elif mode != self.mode:
                self._begin(mode, now)
            elif mode == "train" and (self.fed or len(self.optimizers_known) > 1):
                # The next fetch starts the next step, unless an optimizer of this
                # step steps again first: then a new iteration began here.
                if self.candidate is None:
                    self.candidate = (now, mode)
            elif self.fed:
                return  # a loader drives this loop: the next fetch starts the next step
            else:
                self._begin(mode, now)

    # --- what integrations report -------------------------------------------------
    def fetched(self, t0: int, t1: int, mode: str) -> None:
        """A batch came out of the loader (GetNext from t0 to t1)."""
        if self.pending is not None and not self._drop_unworked():
            if mode == "train" == self.pending[2] and self.optimizers_known:
                # Batches read ahead before any work (the Hugging Face Trainer reads an
                # accumulation window's batches first; a skipped batch): one train step
                # is one optimizer step, so they all are this step's GetNext.
                self.pending_more.append((t0, t1))
                return
            self._commit_pending()  # the previous batch had no visible work: its own step
            self.done = True
        if self.mode is None or self.done:
            self.pending = (t0, t1, mode)
        else:  # another fetch inside the same step (gradient accumulation)
            _native.span(PHASE, GETNEXT, t0, t1)
            self.fed = True
            self.last_end = t1

    def loop_started(self) -> None:
        """A new pass over a loader begins: a batch fetched and never worked on
        (a loop left with `break`) was the last step's GetNext."""
        if self.pending is None:
            return
        if self.mode is not None and self.done:
            t0, t1, _ = self.pending
            self.pending = None
            for a, b in [(t0, t1), *self.pending_more]:
                _native.span(PHASE, GETNEXT, a, b)
            self.pending_more = []
            self._end(max(t1, self.last_end))
            self.mode = None
            self.done = False
        else:
            self._commit_pending()

    def exhausted(self, t0: int, t1: int = 0) -> None:
        """The loader ran out (its last fetch from t0 to t1): the loop is over.
        That last fetch (a multi-process loader shuts its workers down in it)
        is the last step's GetNext; the step ends with it."""
        self._drop_unworked()
        if self.pending is not None:
            if self.pending[2] == "train" and self.optimizers_known:
                # A loader that reads ahead (Accelerate's) runs out before the work on
                # the batches it handed out: that work is still to come in this step.
                if t1 > t0:
                    self.pending_more.append((t0, t1))
                return
            self._commit_pending()
        if self.mode is not None:
            if t1 > t0:
                _native.span(PHASE, GETNEXT, t0, t1)
            self._end(max(t0, t1))
            self.mode = None
            self.done = False

    def forward_started(self, mode: str, now: int) -> None:
        if self.pending is not None or self.done or self.mode != mode:
            self.phase_start(mode, now)
        else:  # inside its step already (the forwards of gradient accumulation, a second model)
            self.worked = True
        self.forwards_in_step += 1

    def forward_ended(self, mode: str, t0: int, t1: int, phase: int = FORWARD) -> None:
        _native.span(PHASE, phase, t0, t1)
        self.last_end = t1
        if phase == FORWARD and mode == "train":
            self.forward_end = t1
        elif phase == FORWARD and self.mode == mode != "train":
            self.done = True  # an eval/predict step is one forward

    def loss(self, t0: int, t1: int) -> None:
        _native.span(PHASE, LOSS, t0, t1)
        self.forward_end = None
        self.last_end = t1

    def backward_started(self, now: int, begins_step: bool = True) -> None:
        """begins_step=False: a backward inside an optimizer step (an LBFGS closure)."""
        if begins_step and (self.pending is not None or self.done or self.mode != "train"):
            self.phase_start("train", now)
        self.worked = True
        if self.forward_end is not None and now > self.forward_end:
            # No loss module or function was seen: the loss is what ran between.
            _native.span(PHASE, LOSS, self.forward_end, now)
        self.forward_end = None

    def backward_ended(self, t0: int, t1: int) -> None:
        _native.span(PHASE, BACKWARD, t0, t1)
        self.last_end = t1
        if not self.optimizers_known and self.mode == "train":
            self.done = True  # no optimizer: one forward+backward is a step

    def optimizer_known(self, key) -> None:
        """An optimizer exists (created, or zero_grad called): work after a fetch."""
        self.optimizers_known.add(key)
        self.worked = True
        if self.pending is not None:
            self._commit_pending()

    def optimizer_started(self, key, now: int) -> None:
        self.optimizers_known.add(key)
        self.worked = True
        if self.candidate is None:
            if self.pending is not None or self.done or self.mode != "train":
                self.phase_start("train", now)
            return
        at, mode = self.candidate
        # Stepping again begins a new iteration, unless a loader drives this loop and
        # several optimizers take turns on its batch (WGAN: critic updates, then the
        # generator's): then only the next fetch does.
        again = key in self.optimizers_in_step and not (self.fed and len(self.optimizers_known) > 1)
        if again or self._another_loop(key):
            fed = self.fed
            self._begin(mode, at)  # this optimizer steps again: a new iteration began there
            self.fed = fed  # still the same loader's loop
        else:
            self.candidate = None  # another optimizer of the same iteration

    def _another_loop(self, key) -> bool:
        """An optimizer new to a loop whose steps each stepped the same other
        optimizers: a second model's loop has begun (a GAN's optimizers all
        step in the previous step too)."""
        return bool(self.optimizers_before) and key not in self.optimizers_before \
            and self.optimizers_in_step == self.optimizers_before

    def optimizer_ended(self, key, t0: int, t1: int) -> None:
        _native.span(PHASE, OPTIMIZER, t0, t1)
        self.optimizers_in_step.add(key)
        self.last_end = t1
        self.done = True
        self.forward_end = None

    def close(self, thread: int = 0) -> None:
        """End of the session: close the open step where its work ended.
        ``thread``: the loop's native thread id when called from another thread."""
        if self.pending is not None and not thread:
            self.loop_started()  # an unused fetch ends the last step (or is one)
        self.pending, self.pending_more = None, []
        if self.mode is not None and not self.suspended:
            self._end(self.last_end if (self.done or thread) and self.last_end else 0, thread)
        self.reset()
