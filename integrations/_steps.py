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
* Acting is no eval step: after a complete train step of a loop no loader
  drives, a forward without grad of a model still in training mode (the native
  roots tell; an RL agent choosing actions) begins nothing; the next train step
  began at the first such forward (none followed by the loop's end: they were
  one eval step).
* A fetch's mode is only known once the work on its batch shows, so a fetch
  after a complete step is held back and recorded, with the step mark at its
  start, when the next phase begins.
* An eval step no loader fed before any train step of its thread (a lone
  forward without grad: a dry run sizing the model) ends at its forward when a
  step of another mode follows, as a loop's last step does at its end: the
  setup in between is in no step. Once training ran, such a step is inside the
  loop (the training accuracy after each update, an evaluation between epochs)
  and lasts until the next step begins.
* A new pass over a loader after such a fetch is no loop end yet: work on the
  batch (a second loader restarted inside the iteration, FixMatch's unlabeled
  data) makes the fetch begin that iteration's step; a fetch of another mode
  (zip's longer loader left with a batch unused, then validation) makes it the
  loop's last GetNext.

* A pass over a loader that begins inside an unfinished train step (its loop was
  left after a fetch: an exception caught outside it, a break, a return) holds its
  first fetch back until work shows: train work makes it the step's GetNext (the
  iteration reads a loader of its own, a reference set's, and that loader's end ends
  no step); other work (the evaluation after the loop) begins its own step there, and
  the unfinished one ends where that fetch began, flagged interrupted.

The tracker is native (``csrc/steps/``): it runs a dozen times in every
training step, where each Python frame of bookkeeping costs about a microsecond.
It records the phase spans itself, and the step marks with tick timestamps, so
the marks land where the step began even when it is recognised later. Its state
is readable from Python under the names below (``mode``, ``pending``, ``done``,
``last_end``, ...), and a method can be replaced on this class (tests inject
failures that way).
"""

from __future__ import annotations

from stepscope.core import annotations as user_marks
from stepscope.core import recording
from stepscope.core.recording import PHASE  # noqa: F401 - kept: integrations imported it from here

GETNEXT, FORWARD, LOSS, BACKWARD, OPTIMIZER, RECOMPUTE = (recording.intern(p) for p in recording.PHASES)

recording.StepTracker.configure(vars(user_marks))  # where by_hand (the program marks its own steps) is read


class StepTracker(recording.StepTracker):
    """StepTracker(on_new_step=None, may_begin=None).

    * ``on_new_step(previous_had_forward)``: called where a step begins after
      another, so an integration can adapt its hooks; with ``every_step`` set
      False, only after a step that showed no forward;
    * ``may_begin()``: False where this process runs no training loop of its own
      (a DataLoader worker running transforms): nothing there is a step;
    * ``background``: set for a thread other than the main one, whose fetches make
      steps only once work (a forward, backward or optimizer step) showed in it;
      ``prefetched`` counts the fetches it dropped as such a thread's read-ahead;
    * ``guess()``: the mode of a fetch reported with mode None (left to its work)
      when no work showed after it; None: "train".

    The callbacks are callables or None (deleting one sets None); a callback may
    close, reset or report to the tracker: the report that called it checks
    again what it holds when it returns.

    What integrations report (arguments by position; the defaults shown may be
    left out): ``fetched(t0, t1, mode)``, ``loop_started()``,
    ``exhausted(t0, t1=0)``, ``forward_started(mode, now)``,
    ``forward_ended(mode, t0, t1, phase=FORWARD)``, ``loss(t0, t1)``,
    ``backward_started(now, begins_step=True)``, ``backward_ended(t0, t1)``,
    ``optimizer_known(key)``, ``optimizer_used()`` (a zero_grad: train work by an
    optimizer not named), ``optimizer_started(key, now)``,
    ``optimizer_ended(key, t0, t1)``; and ``suspend()``/``resume()`` (phases
    recorded, no steps counted: Lightning's sanity check), ``in_step()``,
    ``loop_ended(at=0)`` (a framework's loop ended: its complete last step ends at
    ``at``, or where its work ended; until the next step is between loops),
    ``close(thread=0)`` at session end.

    A train step that ends (at the next step, a loop's end or ``close``) without its
    optimizer step (with no optimizer, its backward) once a train step of the thread
    completed is flagged interrupted (``recording.interrupt_step``): an exception or
    Ctrl-C inside the iteration. Readers give it the mode ``interrupted``.
    """

    __slots__ = ()

    # Operator windows (integrations/torch/_ops.py): ops_step(tracker, step, at) runs when a
    # train step's number reaches ops_due; 0 while a window is open (then also step -1 where
    # an eval step begins or a loop ends). One comparison per step otherwise.
    ops_due = 1 << 62
    ops_step = None
