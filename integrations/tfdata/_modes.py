"""Train or eval: the mode of a custom TensorFlow loop's steps (issue 47 item 4).

A fetch in a loop of the user's own is recorded with its mode left to its work
(the step tracker asks ``guess()`` once that work is done), from this evidence:

* a ``GradientTape`` entered eagerly, or a call of a ``tf.function`` whose
  tracing entered one (the evaluation's ``test_step`` never does) -- train;
* a ``tf.function`` called on the batch whose tracing entered no tape -- eval;
* none of that: the dataset's mode seen before; else a dataset iterated after a
  training dataset ran out -- eval (the validation pass after each epoch);
* still nothing: train, counted as undetermined, and run.json says so.

The same evidence tells the tf.data instrumentor which functions' calls are train
steps where no fetch drives the loop: those whose tracing applied an optimizer
(``applying_functions``, from ``_optimizers``).
"""

from __future__ import annotations

import weakref
from typing import Optional

TRAIN, EVAL = "train", "eval"
MAX_NAMES = 16  # tf.functions whose calls are counted by name


class Modes:
    def __init__(self):
        self.evidence: Optional[str] = None  # what the work on the pending fetch's batch showed
        self.pending = None  # the dataset of the fetch waiting for its mode
        self.current = None  # the dataset of the latest fetch
        self.roles: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # dataset -> mode seen
        self.trained_out = False  # a training dataset ran out: another one now is evaluation
        self.undetermined = 0
        self.training_functions: "weakref.WeakSet" = weakref.WeakSet()  # tf.functions tracing a tape
        self.applying_functions: "weakref.WeakSet" = weakref.WeakSet()  # ...tracing an optimizer's apply
        self.optimizer_seen = False  # an optimizer applied (eagerly or traced) in this process
        self.ran: dict = {}  # tf.function name -> its eager (outermost) calls: what run.json says when no step showed
        # The tf.functions being called, outermost first: one list for every thread, as a
        # strategy traces its replica function on threads of its own (MirroredStrategy).
        self.calls: list = []

    # --- evidence --------------------------------------------------------------------
    def saw(self, mode: str) -> None:
        if self.evidence != TRAIN:  # a tape outweighs a compute-only call on the same batch
            self.evidence = mode

    def tape(self, eager: bool) -> None:
        if eager:
            self.saw(TRAIN)
            return
        for fn in list(self.calls):
            self.training_functions.add(fn)

    def applying(self) -> None:
        """An optimizer's apply was traced: the functions being traced apply gradients (train)."""
        for fn in list(self.calls):
            self.training_functions.add(fn)
            self.applying_functions.add(fn)

    def function_called(self, fn) -> bool:
        """Before a tf.function's call; True: it is the outermost one (its end counts)."""
        self.calls.append(fn)
        return len(self.calls) == 1

    def function_returned(self, fn, outermost: bool, raised: bool) -> None:
        for i in range(len(self.calls) - 1, -1, -1):
            if self.calls[i] is fn:
                del self.calls[i]
                break
        if outermost and not raised:
            self.saw(TRAIN if fn in self.training_functions else EVAL)
            name = getattr(fn, "__name__", None) or "function"
            if name in self.ran or len(self.ran) < MAX_NAMES:
                self.ran[name] = self.ran.get(name, 0) + 1

    # --- fetches ---------------------------------------------------------------------
    def fetched(self, dataset) -> None:
        """After the tracker took a new fetch (and guessed the previous one's mode)."""
        self.pending = self.current = dataset
        self.evidence = None

    def exhausted(self) -> None:
        """After the tracker took the end of the current dataset."""
        if self._role(self.current) == TRAIN:
            self.trained_out = True
        self.pending = None
        self.evidence = None

    def guess(self) -> str:
        """The pending fetch's mode (the step tracker's guess())."""
        known = self._role(self.pending)
        mode = self.evidence or known
        if mode is None and self.trained_out and self.pending is not None:
            mode = EVAL
        if self.evidence is not None and self.pending is not None:
            self._set_role(self.pending, self.evidence)
        if mode is None:
            self.undetermined += 1
            mode = TRAIN
        return mode

    def _role(self, dataset) -> Optional[str]:
        try:
            return self.roles.get(dataset) if dataset is not None else None
        except TypeError:  # not weak-referenceable
            return None

    def _set_role(self, dataset, mode: str) -> None:
        try:
            if self.roles.get(dataset) != TRAIN:  # a dataset that trained once is a training one
                self.roles[dataset] = mode
        except TypeError:
            pass
