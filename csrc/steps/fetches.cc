// The step tracker's state machine, second part: a fetched batch held back until
// its work shows which step it begins (commit_pending), a phase starting (phase_start),
// the loop's edges (loop_started, loop_ended, close) and the optimizers' sets.
#include <algorithm>

#include "steps/tracker.h"

namespace stepscope {
namespace machine {

// A thread that only reads batches (prefetching for another thread's loop): its
// held-back fetches are no steps. True when they were dropped.
bool drop_unworked(Tracker* t) {
  if (!t->background || t->worked || !t->pending_mode) return false;
  Py_CLEAR(t->pending_mode);
  clear_more(t);
  ++t->prefetched;
  return true;
}

// Records the fetches read ahead with the held-back one, and empties the list; one
// that is no (t0, t1) pair (set from Python) is dropped with a TypeError, the list
// emptied still (else every later step would fail on it).
static bool record_more(Tracker* t) {
  PyObject* more = t->pending_more;
  Py_INCREF(more);
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(more); ++i) {
    unsigned long long a, b;
    PyObject* item = new_ref(PyList_GET_ITEM(more, i));  // an int's __index__ may change the list
    ok = PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2 && arg_u64(PyTuple_GET_ITEM(item, 0), &a) &&
         arg_u64(PyTuple_GET_ITEM(item, 1), &b);
    Py_DECREF(item);
    if (ok) {
      phase(kGetNext, a, b);
      t->last_end = std::max<unsigned long long>(t->last_end, b);
    }
  }
  Py_DECREF(more);
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  bool cleared = clear_more(t);
  if (type) PyErr_Restore(type, value, tb);
  else if (!ok && cleared) PyErr_SetString(PyExc_TypeError, "pending_more holds (t0, t1) pairs");
  return ok && cleared;
}

bool append_more(Tracker* t, unsigned long long t0, unsigned long long t1) {
  PyObject* pair = Py_BuildValue("(KK)", t0, t1);
  if (!pair) return false;
  int r = PyList_Append(t->pending_more, pair);
  Py_DECREF(pair);
  return r == 0;
}

// 1 when both fetches' modes are train, 0 when not, -1 on error. The guess may
// change the tracker (its caller checks again what it holds back).
int both_train(Tracker* t, PyObject* a, PyObject* b) {
  Py_INCREF(b);  // perhaps the tracker's own, which the guess may drop
  PyObject* ma = mode_of(t, a);
  int r = ma ? is_train(ma) : -1;
  Py_XDECREF(ma);
  if (r == 1 && b != a) {
    PyObject* mb = mode_of(t, b);
    r = mb ? is_train(mb) : -1;
    Py_XDECREF(mb);
  }
  Py_DECREF(b);
  return r;
}

// Acting forwards before the first train step, and then a loader's batch: not that
// loop's data collection (a loader feeds it) but a dry run sizing the model. They are
// one eval step that ends at their last forward; the setup after it is in no step.
static bool write_acting_alone(PyObject* self) {
  Tracker* t = T(self);
  const unsigned long long at = t->act_at, last = t->last_end;
  const unsigned long resets = t->resets;
  if (!begin(self, g_eval, at)) return false;
  if (t->resets != resets || !same(t->mode, g_eval)) return true;  // closed by a callback
  t->done = 1;
  if (!end(self, std::max(at, last), 0)) return false;
  put(&t->mode, Py_None);
  t->done = 0;
  return true;
}

// The held-back fetch begins its step; `shown`: the mode its work shows, which
// wins over the guess made at the fetch (a loop that calls model.train() after fetching).
bool commit_pending(PyObject* self, PyObject* shown) {
  Tracker* t = T(self);
  if (t->pending_mode && t->act_at && no_mode(t) && !write_acting_alone(self)) return false;
  PyObject* mode = t->pending_mode;  // owned from here
  if (!mode) return true;  // dropped meanwhile (a callback closed the tracker)
  t->pending_mode = nullptr;
  unsigned long long t0 = t->pending_t0, t1 = t->pending_t1;
  const unsigned long resets = t->resets;
  int shows = shown && shown != Py_None ? PyObject_IsTrue(shown) : 0;
  if (shows < 0) Py_CLEAR(mode);
  else if (shows) Py_SETREF(mode, new_ref(shown));
  else Py_SETREF(mode, mode_of(t, mode));
  if (mode && t->resets != resets) {  // closed by the guess: the fetch went with it
    Py_DECREF(mode);
    return true;
  }
  if (mode && t->pending_open) {
    t->pending_open = 0;
    if (is_train(mode) && !no_mode(t) && is_train(t->mode) && !t->done) {
      // train work on a loader the iteration reads itself: its fetch is this step's GetNext
      Py_DECREF(mode);
      phase(kGetNext, t0, t1);
      t->fed = 1;
      t->inner_pass = 1;
      t->last_end = std::max(t->last_end, t1);
      return record_more(t);
    }
    // else an evaluation (or another loop) after a train loop that was left mid-iteration:
    // the unfinished step ends where this pass's first fetch began, flagged interrupted (begin)
  }
  bool ok = mode && begin(self, mode, t0);
  Py_XDECREF(mode);
  if (!ok) return false;
  if (t->resets != resets) return true;
  t->fed = 1;
  phase(kGetNext, t0, t1);
  t->last_end = t1;
  if (!record_more(t)) return false;
  return true;
}

// The held-back fetch showed no work (its loop's work is invisible, or the loop ended
// right after it): it is a step of its own, complete (no interrupted one).
bool commit_no_work(PyObject* self) {
  if (!commit_pending(self, nullptr)) return false;
  if (!no_mode(T(self))) T(self)->done = 1;  // (None: a callback closed the tracker)
  return true;
}

// A forward, backward or optimizer step is starting: open the right step.
bool phase_start(PyObject* self, PyObject* mode, unsigned long long now, bool acting) {
  Tracker* t = T(self);
  if (!flush_held(t)) return false;
  t->worked = 1;
  if (t->pending_mode) return commit_pending(self, mode);
  if (no_mode(t)) {
    if (acting && !t->trained) {
      // Before the first train step, in a loop no loader drives: an agent's first
      // rollout (PPO's, a DQN's warm-up), the data of that first train step, which
      // begins at the first of them; no eval step (see close and write_acting_alone).
      if (!t->act_at) t->act_at = now;
      return true;
    }
    return begin(self, mode, now);
  }
  if (!t->done) return true;
  if (acting && is_train(t->mode) && !t->fed) {
    // A forward without grad of a model left in training mode, after a train step of a
    // loop that no loader drives: an agent choosing its actions between its updates (DQN
    // every iteration, PPO's rollouts), no eval batch. The next train step begins at the
    // first of them; where the loop ends first, they are one eval step (close); where an
    // eval step begins first, they stay in the last train step.
    if (!t->act_at) t->act_at = now;
    return true;
  }
  if (is_train(mode) && t->mark_mode && t->fed) {
    // Eval forwards, then train work on the same fetched batch (a teacher model in
    // eval mode, then the student): one train step.
    put(&t->mark_mode, g_train);
    if (!flush_mark(t)) return false;
    put(&t->mode, g_train);
    t->done = 0;
  } else if (!same(mode, t->mode)) {
    return begin(self, mode, now);
  } else if (is_train(mode) && (t->fed || PySet_GET_SIZE(t->opt_known) > 1)) {
    // The next fetch starts the next step, unless an optimizer of this step steps
    // again first: then a new iteration began here.
    if (!t->cand_mode) {
      put(&t->cand_mode, mode);
      t->cand_at = t->act_at && t->act_at < now ? t->act_at : now;
      t->act_at = 0;
    }
  } else if (!t->fed) {
    return begin(self, mode, now);
  }  // else a loader drives this loop: the next fetch starts the next step
  return true;
}

// The held-back fetch was read and never worked on (a loop left with break, zip's
// longer loader): the last GetNext of the loop, which ends there.
bool end_with_pending(PyObject* self, bool followed) {
  Tracker* t = T(self);
  Py_CLEAR(t->pending_mode);
  phase(kGetNext, t->pending_t0, t->pending_t1);
  t->last_end = std::max(t->pending_t1, t->last_end);
  if (!record_more(t)) return false;
  if (!end(self, t->last_end, 0, followed)) return false;
  put(&t->mode, Py_None);
  t->done = 0;
  return true;
}

bool loop_started(PyObject* self) {
  Tracker* t = T(self);
  if (!flush_held(t)) return false;
  if (!t->pending_mode) {
    // A pass begins while a train step is open and unfinished: its loop was left (an
    // exception caught outside it, a break or return after the fetch), or the iteration
    // reads a loader of its own. The first fetch of the pass is held back (fetched) until
    // its work tells which (commit_pending).
    if (!no_mode(t) && is_train(t->mode) && !t->done && !t->suspended) t->pass_in_open = 1;
    return true;
  }
  if (!no_mode(t) && t->done) {
    // A fetch held back after a complete step, and now a pass begins: either the fetch
    // was the last of its loop, or the program restarts a second loader inside its
    // iteration (FixMatch's unlabeled data) and the fetch begins that iteration's step.
    // What comes next tells: work on it (phase_start), or a fetch of another mode.
    t->pass_begun = 1;
    return true;
  }
  return commit_pending(self, nullptr);
}

// A framework tells that its loop (an epoch's training, a validation pass) ended at `at`
// (0: where the open step's work ended): the open step, when complete, ends there, and
// what runs until the next step (validation start-up, an epoch's end) is between loops
// (SPEC §3), in no step. With a fetch held back (a loader reading ahead: Lightning's
// validation in mid-epoch, its next train batch already read) nothing changes: the
// fetch's own rules place it (loop_started, fetched).
bool loop_ended(PyObject* self, unsigned long long at) {
  Tracker* t = T(self);
  if (!flush_held(t)) return false;
  if (no_mode(t) || !t->done || t->suspended || t->pending_mode) return true;  // nothing to end here
  if (!at || at < t->last_end) at = t->last_end;
  if (!end(self, at, 0)) return false;
  put(&t->mode, Py_None);
  t->done = 0;
  return true;
}

bool close(PyObject* self, unsigned long long thread) {
  Tracker* t = T(self);
  if (thread) {  // another thread ends the loop (session end): a part held back is dropped
    Py_CLEAR(t->held_group);
    Py_CLEAR(t->held_mode);
  } else if (!flush_held(t)) {
    return false;
  }
  if (t->pending_mode && !thread) {
    bool ok = !no_mode(t) && t->done ? end_with_pending(self) : commit_no_work(self);
    if (!ok) return false;
  }
  Py_CLEAR(t->pending_mode);
  if (!clear_more(t)) return false;
  if (t->act_at && !thread && !t->suspended) {
    // no train step followed the last acting forwards: a last evaluation (or, before any
    // training, the program's only one), a step of its own
    if (!begin(self, g_eval, t->act_at)) return false;
    t->done = 1;
  }
  if (!no_mode(t) && !t->suspended) {
    unsigned long long at = (t->done || thread) && t->last_end ? t->last_end : 0;
    if (!end(self, at, thread)) return false;
  }
  return reset(t);
}

// An optimizer new to a loop whose steps each stepped the same other optimizers:
// a second model's loop has begun (a GAN's optimizers all step in the previous step too).
int another_loop(Tracker* t, PyObject* key) {
  if (PySet_GET_SIZE(t->opt_before) == 0) return 0;
  int in = set_contains(t->opt_before, key);
  if (in != 0) return in < 0 ? -1 : 0;
  PyObject *now = new_ref(t->opt_in_step), *before = new_ref(t->opt_before);
  int r = PyObject_RichCompareBool(now, before, Py_EQ);
  Py_DECREF(now);
  Py_DECREF(before);
  return r;
}

}  // namespace machine
}  // namespace stepscope
