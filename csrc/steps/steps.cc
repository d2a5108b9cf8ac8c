// The step tracker: integrations report what they see (a batch fetched, a
// forward, a backward, an optimizer step) and this decides where steps begin
// and end. The rules are documented where integrations meet it,
// integrations/_steps.py, whose StepTracker subclasses this type.
//
// Why native: it runs a dozen times in every training step, between torch's own
// work, where each Python frame of bookkeeping costs about a microsecond of
// cache misses (BENCHMARKS.md, bench/overhead.py). Here each report is one C
// call that records its phase span directly.
//
// State that Python reads or sets (the integrations, the operator windows) is
// exposed as attributes with the names and shapes the Python tracker had.
#include "steps/steps.h"

#include <structmember.h>

#include <algorithm>

#include "common/format.h"
#include "common/pyint.h"
#include "record/recorder.h"

namespace stepscope {
namespace {

// Phase names are interned first (module.cc): their ids are 0..5.
enum : uint32_t { kGetNext = 0, kForward = 1, kLoss = 2, kBackward = 3, kOptimizer = 4, kRecompute = 5 };

PyObject* g_train = nullptr;    // "train"
PyObject* g_eval = nullptr;     // "eval"
PyObject* g_ops_due = nullptr;  // "ops_due"
PyObject* g_ops_step = nullptr;
PyObject* g_by_hand = nullptr;  // "by_hand"
PyObject* g_marks = nullptr;    // stepscope.core.annotations' namespace: is by_hand set?

struct Tracker {
  PyObject_HEAD
  PyObject* on_new_step;  // on_new_step(previous_had_forward) or None
  PyObject* may_begin;    // may_begin() -> False where this process runs no loop, or None
  PyObject* guess;        // guess() -> the mode of a fetch whose work never showed, or None
  PyObject* mode;         // mode of the open step; None between loops
  PyObject* pending_mode; // a held-back fetch (pending_t0..t1) of this guessed mode; null: none
  PyObject* pending_more; // list of (t0, t1) read ahead with it
  PyObject* mark_mode;    // an eval step's mark not yet written (at mark_at); null: none
  PyObject* cand_mode;    // a possible step start (at cand_at), several optimizers; null: none
  PyObject* opt_in_step;  // sets of optimizer keys
  PyObject* opt_before;
  PyObject* opt_known;
  // A Forward held back, unwritten (held_t0..held_t1, of held_mode): a part of one
  // forward the program called directly (model.forward(x)), whose submodules are the
  // roots, all of one group. The next part of the same group extends it, until its
  // first part (held_first: compared, never dereferenced) starts again: the next
  // forward. Anything else first writes it (flush_held). null: none.
  PyObject* held_group;
  PyObject* held_mode;
  const void* held_first;
  unsigned long long held_t0, held_t1;
  unsigned long long pending_t0, pending_t1, mark_at, cand_at, last_end, forward_end;
  long forwards_in_step;
  unsigned long long act_at;  // the first acting forward since the last train step's work; 0: none
  unsigned long prefetched;  // fetches dropped as a background thread's read-ahead
  char background, worked, suspended, done, fed, has_forward_end;
  char every_step;  // on_new_step at every step; else only after one that showed no forward
  char opt_used;    // an optimizer was seen at work without its key (a native zero_grad range)
  char pass_begun;  // a pass began after the held-back fetch of a complete step (loop_started)
  char trained;     // a train step began on this thread: a fact kept across loops, as opt_known
  char finished;    // a train step of this thread completed (its optimizer step, or backward): kept too
  // Bumped by every reset (close, suspend, reset): a report that called out to Python
  // (a callback, a user key's __eq__) and finds it changed stops there, the state it
  // read before gone (another thread's close at session end).
  unsigned long resets;
};

inline Tracker* T(PyObject* o) { return reinterpret_cast<Tracker*>(o); }
inline PyObject* new_ref(PyObject* o) {  // Py_NewRef, which 3.9 lacks
  Py_INCREF(o);
  return o;
}

bool same(PyObject* a, PyObject* b) {
  if (a == b) return true;
  if (!a || !b || !PyUnicode_Check(a) || !PyUnicode_Check(b)) return false;
  return PyUnicode_Compare(a, b) == 0;
}
inline bool is_train(PyObject* m) { return same(m, g_train); }
inline bool no_mode(Tracker* t) { return t->mode == Py_None; }
inline bool has_optimizer(Tracker* t) { return t->opt_used || PySet_GET_SIZE(t->opt_known) > 0; }

// callable(arg) or callable(), on a reference of its own: the call may replace the
// attribute that held it.
PyObject* call_held(PyObject* callable, PyObject* arg) {
  Py_INCREF(callable);
  PyObject* r = arg ? PyObject_CallOneArg(callable, arg) : PyObject_CallNoArgs(callable);
  Py_DECREF(callable);
  return r;
}

// Whether r (a new reference, or null after an error) is true: 1, 0, or -1 on error.
int truth_of(PyObject* r) {
  if (!r) return -1;
  int yes = PyObject_IsTrue(r);
  Py_DECREF(r);
  return yes;
}

// A fetch's mode (new reference): as reported, or, where the fetch left it to
// its work (None) and that work never showed, the integration's guess now.
PyObject* mode_of(Tracker* t, PyObject* mode) {
  if (mode != Py_None) return new_ref(mode);
  if (t->guess == Py_None) return new_ref(g_train);
  return call_held(t->guess, nullptr);
}

// Replaces an owned slot (value may be null).
inline void put(PyObject** slot, PyObject* value) {
  Py_XINCREF(value);
  Py_XSETREF(*slot, value);
}

inline void phase(uint32_t name, uint64_t t0, uint64_t t1) { record_span(kCatPhase, name, t0, t1); }

bool arg_u64(PyObject* o, unsigned long long* out) { return u64_of(o, out); }

// The operator windows' schedule (integrations/torch/_ops.py), a class attribute read
// at every step begin. Kept per type while the type is unchanged (assigning the class
// attribute, on the type or a base, changes its version tag) where instances have no
// dict of their own: the attribute lookup cost ~0.2 us a step, its cache lines cold.
bool ops_due(PyObject* self, long long* due) {
  static PyTypeObject* cached_type = nullptr;
  static unsigned int cached_tag = 0;
  static long long cached_due = 0;
  PyTypeObject* type = Py_TYPE(self);
  if (type == cached_type && cached_tag && version_tag(type) == cached_tag) {
    *due = cached_due;
    return true;
  }
  PyObject* v = PyObject_GetAttr(self, g_ops_due);
  if (!v) return false;
  bool ok = i64_of(v, due);
  Py_DECREF(v);
  if (ok && type->tp_dictoffset == 0) {
    cached_type = type;
    cached_tag = version_tag(type);  // assigned by the lookup just made
    cached_due = *due;
  }
  return ok;
}

bool ops_step(PyObject* self, long long step, unsigned long long at) {
  PyObject* f = PyObject_GetAttr(self, g_ops_step);
  if (!f) return false;
  PyObject* r = PyObject_CallFunction(f, "OLK", self, step, at);
  Py_DECREF(f);
  Py_XDECREF(r);
  return r != nullptr;
}

bool begin_step_of(PyObject* mode, unsigned long long at, int32_t* n) {
  int64_t id = intern_pyname(mode);
  if (id < 0) return false;
  *n = begin_step(uint32_t(id), at);
  return true;
}

bool new_set(PyObject** slot) {
  PyObject* s = PySet_New(nullptr);
  if (!s) return false;
  Py_XSETREF(*slot, s);
  return true;
}

bool clear_more(Tracker* t) {
  t->pass_begun = 0;
  if (t->pending_more && PyList_CheckExact(t->pending_more) && PyList_GET_SIZE(t->pending_more) == 0) return true;
  PyObject* l = PyList_New(0);
  if (!l) return false;
  Py_XSETREF(t->pending_more, l);
  return true;
}

bool reset(Tracker* t) {
  ++t->resets;
  Py_CLEAR(t->held_group);
  Py_CLEAR(t->held_mode);
  t->suspended = t->done = t->fed = t->has_forward_end = 0;
  put(&t->mode, Py_None);
  Py_CLEAR(t->pending_mode);
  Py_CLEAR(t->mark_mode);
  Py_CLEAR(t->cand_mode);
  if (!clear_more(t) || !new_set(&t->opt_in_step) || !new_set(&t->opt_before)) return false;
  // the optimizers known are a fact of the process, kept across loops
  if (!t->opt_known && !new_set(&t->opt_known)) return false;
  t->last_end = 0;
  t->act_at = 0;
  t->forwards_in_step = 0;
  return true;
}

// A forward (or a recomputed one) ended: its phase written, the step told.
bool forward_done(Tracker* t, PyObject* mode, unsigned long long t0, unsigned long long t1, uint32_t ph) {
  phase(ph, t0, t1);
  t->last_end = t1;
  if (ph == kForward && is_train(mode)) {
    t->forward_end = t1;
    t->has_forward_end = 1;
  } else if (ph == kForward && same(t->mode, mode) && !is_train(mode)) {
    t->done = 1;  // an eval/predict step is one forward
  }
  return true;
}

// Writes a held-back Forward (Tracker.held_group): before anything else is reported.
// Out of line and cold: the check below is inline in every report (a call each
// would cost its cache lines ~12 times a step; bench/instructions.py --cache).
__attribute__((noinline, cold)) bool write_held(Tracker* t) {
  PyObject* mode = t->held_mode;  // owned from here
  t->held_mode = nullptr;
  Py_CLEAR(t->held_group);
  bool ok = forward_done(t, mode, t->held_t0, t->held_t1, kForward);
  Py_DECREF(mode);
  return ok;
}

inline bool flush_held(Tracker* t) { return __builtin_expect(t->held_group == nullptr, 1) || write_held(t); }

bool flush_mark(Tracker* t) {
  if (!t->mark_mode) return true;
  PyObject* mode = t->mark_mode;
  t->mark_mode = nullptr;
  int32_t n;
  bool ok = begin_step_of(mode, t->mark_at, &n);
  Py_DECREF(mode);
  return ok;
}

bool end(PyObject* self, unsigned long long at, unsigned long long thread, bool followed = false);

// A train step that ends without its optimizer step (with no optimizer, its backward):
// an exception or Ctrl-C inside the iteration, a last accumulation window never stepped.
// Its time stays on the timeline, flagged interrupted: no train step (SPEC §3). Only
// once a train step of this thread completed: where none ever does, the completion is
// what stepscope cannot see (a loop note says so), not an interruption.
inline void flag_unfinished(Tracker* t) {
  if (!no_mode(t) && is_train(t->mode) && !t->done && t->finished && !t->suspended) interrupt_step(0);
}

bool begin(PyObject* self, PyObject* mode, unsigned long long at) {
  Tracker* t = T(self);
  // the iteration began acting; before any step, acting forwards join whatever step follows
  if (t->act_at && (is_train(mode) || no_mode(t)) && t->act_at < at) at = t->act_at;
  t->act_at = 0;
  flag_unfinished(t);
  Py_INCREF(mode);  // held across callbacks that may change the tracker
  const unsigned long resets = t->resets;
  bool ok = false;
  if (no_mode(t) && t->may_begin != Py_None) {
    int yes = truth_of(call_held(t->may_begin, nullptr));
    if (yes < 0) goto out;
    if (!yes) t->suspended = 1;  // checked where a loop starts: workers run none
    // yes: a fact of this process (a forked child gets a tracker of its own), so that a
    // loop starting on every short epoch asks no more
    else put(&t->may_begin, Py_None);
  }
  if (!no_mode(t) && t->on_new_step != Py_None && (t->every_step || t->forwards_in_step == 0)) {
    PyObject* r = call_held(t->on_new_step, t->forwards_in_step > 0 ? Py_True : Py_False);
    if (!r) goto out;
    Py_DECREF(r);
  }
  if (t->resets != resets) {  // closed by a callback: this step begins nothing
    ok = true;
    goto out;
  }
  if (!flush_mark(t)) goto out;
  if (!no_mode(t) && t->done && !t->fed && !is_train(t->mode) && !same(mode, t->mode) && !t->trained &&
      t->last_end && t->last_end <= at) {
    // An eval step no loader fed before any training (a lone forward without grad: a dry
    // run that sizes or initialises the model) ends at its forward, as at a loop's end
    // (close): what follows until the loop (making the optimizer, the data) is no part of
    // it. Once training ran, such a step is inside the loop (the training accuracy after
    // each update, an evaluation between epochs) and lasts until the next step begins.
    if (!end(self, t->last_end, 0)) goto out;
    put(&t->mode, Py_None);
    t->done = 0;
  }
  if (g_marks) {  // the program marks its own steps: phases only
    PyObject* by_hand = PyDict_GetItemWithError(g_marks, g_by_hand);
    if (!by_hand && PyErr_Occurred()) goto out;
    int hand = by_hand ? truth_of(new_ref(by_hand)) : 0;
    if (hand < 0) goto out;
    if (hand) t->suspended = 1;
  }
  if (t->resets != resets) {
    ok = true;
    goto out;
  }
  if (!t->suspended) {
    long long due;
    if (is_train(mode)) {
      int32_t n;
      if (!begin_step_of(mode, at, &n) || !ops_due(self, &due)) goto out;
      if (n >= due && !ops_step(self, n, at)) goto out;
    } else {  // written when the step's mode is settled (see phase_start)
      put(&t->mark_mode, mode);
      t->mark_at = at;
      if (!ops_due(self, &due)) goto out;
      if (!due && !ops_step(self, -1, at)) goto out;
    }
    if (t->resets != resets) {
      ok = true;
      goto out;
    }
  }
  put(&t->mode, mode);
  t->done = t->fed = 0;
  if (is_train(mode)) t->trained = 1;
  Py_CLEAR(t->cand_mode);
  {
    // this step's set becomes the one before; the old one before, emptied, is this step's
    // (no set made and freed a step); a set someone else holds too is not reused
    PyObject* before = t->opt_before;
    const bool reuse = PySet_CheckExact(before) && Py_REFCNT(before) == 1;
    PyObject* next = reuse ? before : PySet_New(nullptr);
    if (!next) goto out;
    t->opt_before = t->opt_in_step;
    t->opt_in_step = next;
    if (reuse) {  // emptied in place, held: its keys' __del__ may report here, or replace it
      Py_INCREF(next);
      PySet_Clear(next);
      Py_DECREF(next);
    } else {
      Py_DECREF(before);
    }
  }
  t->has_forward_end = 0;
  t->forwards_in_step = 0;
  ok = true;
out:
  Py_DECREF(mode);
  return ok;
}

// Ends the open step at `at` (0: now); `thread`: the native id of the loop's
// thread when another thread ends it (at session end). `followed`: a step of the next
// loop began already (its fetch): an operator window left open closes where that step
// begins, inside it, not here after the fetch.
bool end(PyObject* self, unsigned long long at, unsigned long long thread, bool followed) {
  Tracker* t = T(self);
  if (thread) {
    if (!t->mark_mode) end_step_of_thread(thread, at ? at : ticks());  // an unwritten mark began nothing
    Py_CLEAR(t->mark_mode);
    return true;
  }
  if (!flush_mark(t)) return false;
  flag_unfinished(t);
  long long due;
  if (!ops_due(self, &due)) return false;
  if (!due && !followed) {
    // An operator window open at a loop's end closes inside the step it sampled:
    // its cost must not fall between two steps (SPEC §3: steps add up)
    if (!ops_step(self, -1, at ? at : ticks())) return false;
    at = at ? std::max<unsigned long long>(at, ticks()) : 0;
  }
  end_step(at);
  return true;
}

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
bool record_more(Tracker* t) {
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
bool write_acting_alone(PyObject* self) {
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
bool phase_start(PyObject* self, PyObject* mode, unsigned long long now, bool acting = false) {
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
bool end_with_pending(PyObject* self, bool followed = false) {
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
  if (!t->pending_mode) return true;
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

// Set operations on the tracker's sets hash and compare user keys (their __hash__ and
// __eq__ run Python that may replace the set): each holds the set it works on.
bool set_add(PyObject* set, PyObject* key) {
  Py_INCREF(set);
  int r = PySet_Add(set, key);
  Py_DECREF(set);
  return r == 0;
}

int set_contains(PyObject* set, PyObject* key) {
  Py_INCREF(set);
  int r = PySet_Contains(set, key);
  Py_DECREF(set);
  return r;
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

}  // namespace

// --- the reports, typed: the native hooks call these directly (steps.h) ------------------
namespace track {

bool fetched(PyObject* self, unsigned long long t0, unsigned long long t1, PyObject* mode) {
  Tracker* t = T(self);
  if (!flush_held(t)) return false;
  if (t->pending_mode && !drop_unworked(t)) {
    if (has_optimizer(t)) {
      // Batches read ahead before any work (the Hugging Face Trainer reads an
      // accumulation window's batches first; a skipped batch): one train step is
      // one optimizer step, so they all are this step's GetNext.
      int ahead = both_train(t, mode, t->pending_mode);
      if (ahead < 0) return false;
      if (!t->pending_mode) return fetched(self, t0, t1, mode);  // the guess closed the tracker: afresh
      if (ahead) return append_more(t, t0, t1);
    }
    if (t->pass_begun) {
      if (!end_with_pending(self, true)) return false;  // a new loop of another mode begins
    } else {
      if (!commit_no_work(self)) return false;
    }
  }
  if (no_mode(t) || t->done) {
    put(&t->pending_mode, mode);
    t->pending_t0 = t0;
    t->pending_t1 = t1;
  } else {  // another fetch inside the same step (gradient accumulation)
    phase(kGetNext, t0, t1);
    t->fed = 1;
    t->last_end = t1;
  }
  return true;
}

bool exhausted(PyObject* self, unsigned long long t0, unsigned long long t1) {
  Tracker* t = T(self);
  if (!flush_held(t)) return false;
  drop_unworked(t);
  if (t->pending_mode) {
    int ahead = has_optimizer(t) ? both_train(t, t->pending_mode, t->pending_mode) : 0;
    if (ahead < 0) return false;
    if (!t->pending_mode) return exhausted(self, t0, t1);  // the guess closed the tracker: afresh
    if (ahead) {
      // A loader that reads ahead (Accelerate's) runs out before the work on the
      // batches it handed out: that work is still to come in this step.
      return t1 <= t0 || append_more(t, t0, t1);
    }
    if (t->pass_begun) {
      if (!end_with_pending(self)) return false;
    } else if (!commit_no_work(self)) {
      return false;
    }
  }
  if (!no_mode(t)) {
    if (t1 > t0) phase(kGetNext, t0, t1);
    if (!end(self, std::max(t0, t1), 0)) return false;
    put(&t->mode, Py_None);
    t->done = 0;
  }
  return true;
}

bool forward_started(PyObject* self, PyObject* mode, unsigned long long now, PyObject* group, PyObject* part,
                     bool acting) {
  Tracker* t = T(self);
  if (group && group != Py_None && t->held_group == group && same(t->held_mode, mode) && part != t->held_first)
    return true;  // the next part of the forward held back
  if (!flush_held(t)) return false;
  if (t->pending_mode || t->done || !same(t->mode, mode)) {
    if (!phase_start(self, mode, now, acting)) return false;
  } else {  // inside its step already (gradient accumulation's forwards, a second model)
    t->worked = 1;
  }
  t->forwards_in_step += 1;
  return true;
}

bool forward_ended(PyObject* self, PyObject* mode, unsigned long long t0, unsigned long long t1, uint32_t ph,
                   PyObject* group, PyObject* part) {
  Tracker* t = T(self);
  if (group && group != Py_None && ph == kForward) {
    if (t->held_group == group && same(t->held_mode, mode)) {
      t->held_t1 = t1;  // the same forward's next part
      return true;
    }
    if (!flush_held(t)) return false;
    put(&t->held_group, group);
    put(&t->held_mode, mode);
    t->held_first = part;
    t->held_t0 = t0;
    t->held_t1 = t1;
    return true;
  }
  return flush_held(t) && forward_done(t, mode, t0, t1, ph);
}

bool loss(PyObject* self, unsigned long long t0, unsigned long long t1) {
  Tracker* t = T(self);
  if (!flush_held(t)) return false;
  phase(kLoss, t0, t1);
  t->has_forward_end = 0;
  t->last_end = t1;
  return true;
}

bool backward_started(PyObject* self, unsigned long long now, bool begins) {
  Tracker* t = T(self);
  if (!flush_held(t)) return false;
  if (begins && (t->pending_mode || t->done || !is_train(t->mode)) && !phase_start(self, g_train, now))
    return false;
  t->worked = 1;
  if (t->has_forward_end && now > t->forward_end) phase(kLoss, t->forward_end, now);  // no loss seen: what ran between
  t->has_forward_end = 0;
  return true;
}

bool backward_ended(PyObject* self, unsigned long long t0, unsigned long long t1) {
  Tracker* t = T(self);
  if (!flush_held(t)) return false;
  phase(kBackward, t0, t1);
  t->last_end = t1;
  if (!has_optimizer(t) && is_train(t->mode)) t->done = t->finished = 1;  // no optimizer: forward+backward
  return true;
}

// An optimizer's zero_grad (which one, its range does not tell): train work on
// the fetched batch, like a backward.
bool optimizer_used(PyObject* self) {
  Tracker* t = T(self);
  if (!flush_held(t)) return false;
  t->opt_used = t->worked = 1;
  return !t->pending_mode || commit_pending(self, g_train);
}

bool optimizer_started(PyObject* self, PyObject* key, unsigned long long now) {
  Tracker* t = T(self);
  if (!flush_held(t)) return false;
  const unsigned long resets = t->resets;
  if (!set_add(t->opt_known, key)) return false;
  if (t->resets != resets) return true;  // a key's __eq__ closed the tracker
  if (!flush_held(t)) return false;      // (or reported a forward)
  t->worked = 1;
  if (!t->cand_mode) return !(t->pending_mode || t->done || !is_train(t->mode)) || phase_start(self, g_train, now);
  // Stepping again begins a new iteration, unless a loader drives this loop and
  // several optimizers take turns on its batch (WGAN: critic updates, then the
  // generator's, on every batch or every n-th): then only the next fetch does.
  // So does a second model's optimizer, but only in a loop no loader drives.
  int in = set_contains(t->opt_in_step, key);
  if (in < 0) return false;
  bool again = in && !(t->fed && PySet_GET_SIZE(t->opt_known) > 1);
  int other = again || t->fed ? 0 : another_loop(t, key);
  if (other < 0) return false;
  if (!t->cand_mode || t->resets != resets) return true;  // changed by a key's __eq__: nothing to begin
  if (again || other) {
    char fed = t->fed;
    PyObject* mode = t->cand_mode;
    Py_INCREF(mode);
    bool ok = begin(self, mode, t->cand_at);  // this optimizer steps again: a new iteration began there
    Py_DECREF(mode);
    if (!ok) return false;
    t->fed = fed;  // still the same loader's loop
  } else {
    Py_CLEAR(t->cand_mode);  // another optimizer of the same iteration
  }
  return true;
}

bool optimizer_ended(PyObject* self, PyObject* key, unsigned long long t0, unsigned long long t1) {
  Tracker* t = T(self);
  if (!flush_held(t)) return false;
  phase(kOptimizer, t0, t1);
  if (!set_add(t->opt_in_step, key)) return false;
  t->last_end = t1;
  t->done = 1;
  t->finished |= is_train(t->mode);
  t->has_forward_end = 0;
  return true;
}

bool loop_started(PyObject* self) { return stepscope::loop_started(self); }

}  // namespace track

namespace {

// ------------------------------------------------------------ Python methods

#define RET(ok) return (ok) ? new_ref(Py_None) : nullptr
#define NARGS(lo, hi, sig)                                          \
  if (nargs < (lo) || nargs > (hi)) {                                \
    PyErr_SetString(PyExc_TypeError, "StepTracker." sig);            \
    return nullptr;                                                  \
  }

PyObject* m_fetched(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(3, 3, "fetched(t0, t1, mode)");
  unsigned long long t0, t1;
  if (!arg_u64(a[0], &t0) || !arg_u64(a[1], &t1)) return nullptr;
  RET(track::fetched(self, t0, t1, a[2]));
}

PyObject* m_exhausted(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(1, 2, "exhausted(t0, t1=0)");
  unsigned long long t0, t1 = 0;
  if (!arg_u64(a[0], &t0) || (nargs > 1 && !arg_u64(a[1], &t1))) return nullptr;
  RET(track::exhausted(self, t0, t1));
}

PyObject* m_forward_started(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(2, 5, "forward_started(mode, now, group=None, part=None, acting=False)");
  unsigned long long now;
  if (!arg_u64(a[1], &now)) return nullptr;
  int acting = nargs > 4 ? PyObject_IsTrue(a[4]) : 0;  // eval only because grad is off, the module training
  if (acting < 0) return nullptr;
  RET(track::forward_started(self, a[0], now, nargs > 2 ? a[2] : nullptr, nargs > 3 ? a[3] : nullptr, acting));
}

PyObject* m_forward_ended(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(3, 6, "forward_ended(mode, t0, t1, phase=FORWARD, group=None, part=None)");
  unsigned long long t0, t1, ph = kForward;
  if (!arg_u64(a[1], &t0) || !arg_u64(a[2], &t1) || (nargs > 3 && !arg_u64(a[3], &ph))) return nullptr;
  if (ph > kRecompute) {  // a span of another name would pass for a phase
    PyErr_Format(PyExc_ValueError, "StepTracker.forward_ended: phase %llu is no phase id (0..%d)", ph, int(kRecompute));
    return nullptr;
  }
  RET(track::forward_ended(self, a[0], t0, t1, uint32_t(ph), nargs > 4 ? a[4] : nullptr, nargs > 5 ? a[5] : nullptr));
}

PyObject* m_loss(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(2, 2, "loss(t0, t1)");
  unsigned long long t0, t1;
  if (!arg_u64(a[0], &t0) || !arg_u64(a[1], &t1)) return nullptr;
  RET(track::loss(self, t0, t1));
}

PyObject* m_backward_started(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(1, 2, "backward_started(now, begins_step=True)");
  unsigned long long now;
  if (!arg_u64(a[0], &now)) return nullptr;
  int begins = nargs > 1 ? PyObject_IsTrue(a[1]) : 1;  // False: a backward inside an optimizer step
  if (begins < 0) return nullptr;
  RET(track::backward_started(self, now, begins));
}

PyObject* m_backward_ended(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(2, 2, "backward_ended(t0, t1)");
  unsigned long long t0, t1;
  if (!arg_u64(a[0], &t0) || !arg_u64(a[1], &t1)) return nullptr;
  RET(track::backward_ended(self, t0, t1));
}

PyObject* m_optimizer_known(PyObject* self, PyObject* key) {
  Tracker* t = T(self);
  if (!set_add(t->opt_known, key)) return nullptr;
  t->worked = 1;
  RET(!t->pending_mode || commit_pending(self, nullptr));
}

PyObject* m_optimizer_used(PyObject* self, PyObject*) { RET(track::optimizer_used(self)); }

PyObject* m_optimizer_started(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(2, 2, "optimizer_started(key, now)");
  unsigned long long now;
  if (!arg_u64(a[1], &now)) return nullptr;
  RET(track::optimizer_started(self, a[0], now));
}

PyObject* m_optimizer_ended(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(3, 3, "optimizer_ended(key, t0, t1)");
  unsigned long long t0, t1;
  if (!arg_u64(a[1], &t0) || !arg_u64(a[2], &t1)) return nullptr;
  RET(track::optimizer_ended(self, a[0], t0, t1));
}

PyObject* m_phase_start(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(2, 2, "phase_start(mode, now)");
  unsigned long long now;
  if (!arg_u64(a[1], &now)) return nullptr;
  RET(phase_start(self, a[0], now));
}

PyObject* m_loop_started(PyObject* self, PyObject*) { RET(loop_started(self)); }

PyObject* m_loop_ended(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(0, 1, "loop_ended(at=0)");
  unsigned long long at = 0;
  if (nargs && !arg_u64(a[0], &at)) return nullptr;
  RET(loop_ended(self, at));
}

PyObject* m_close(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
  NARGS(0, 1, "close(thread=0)");
  unsigned long long thread = 0;
  if (nargs && !arg_u64(a[0], &thread)) return nullptr;
  RET(close(self, thread));
}

PyObject* m_suspend(PyObject* self, PyObject*) {
  if (!close(self, 0)) return nullptr;
  T(self)->suspended = 1;
  Py_RETURN_NONE;
}

PyObject* m_resume(PyObject* self, PyObject*) { RET(!T(self)->suspended || reset(T(self))); }

PyObject* m_reset(PyObject* self, PyObject*) { RET(reset(T(self))); }

PyObject* m_in_step(PyObject* self, PyObject*) {
  Tracker* t = T(self);
  return PyBool_FromLong(t->pending_mode || (!no_mode(t) && !t->done));
}

PyObject* m_configure(PyObject*, PyObject* marks) {
  if (!PyDict_Check(marks)) {
    PyErr_SetString(PyExc_TypeError, "configure(namespace): the dict holding by_hand");
    return nullptr;
  }
  put(&g_marks, marks);
  Py_RETURN_NONE;
}

#define FAST(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(f)), METH_FASTCALL
PyMethodDef methods[] = {
    {"fetched", FAST(m_fetched), "A batch came out of the loader (GetNext from t0 to t1)."},
    {"exhausted", FAST(m_exhausted), "The loader ran out (its last fetch from t0 to t1): the loop is over."},
    {"loop_started", m_loop_started, METH_NOARGS, "A new pass over a loader begins."},
    {"loop_ended", FAST(m_loop_ended), "A framework's loop ended at tick `at` (0: where its work ended)."},
    {"forward_started", FAST(m_forward_started), nullptr},
    {"forward_ended", FAST(m_forward_ended), nullptr},
    {"loss", FAST(m_loss), nullptr},
    {"backward_started", FAST(m_backward_started), "begins_step=False: a backward inside an optimizer step."},
    {"backward_ended", FAST(m_backward_ended), nullptr},
    {"optimizer_known", m_optimizer_known, METH_O, "An optimizer exists (created): its key."},
    {"optimizer_used", m_optimizer_used, METH_NOARGS, "An optimizer is at work (zero_grad), which one unknown."},
    {"optimizer_started", FAST(m_optimizer_started), nullptr},
    {"optimizer_ended", FAST(m_optimizer_ended), nullptr},
    {"phase_start", FAST(m_phase_start), "A forward, backward or optimizer step is starting."},
    {"in_step", m_in_step, METH_NOARGS, "A step is open, or a fetched batch waits for its work."},
    {"close", FAST(m_close), "End of the session: close the open step where its work ended."},
    {"suspend", m_suspend, METH_NOARGS, "Stop counting steps (phases are still recorded)."},
    {"resume", m_resume, METH_NOARGS, nullptr},
    {"reset", m_reset, METH_NOARGS, nullptr},
    {"configure", m_configure, METH_O | METH_STATIC, "configure(namespace): where by_hand is read."},
    {nullptr, nullptr, 0, nullptr}};

#define MEMBER(name, type, field) {name, type, offsetof(Tracker, field), 0, nullptr}
PyMemberDef members[] = {
    MEMBER("background", T_BOOL, background),
    MEMBER("every_step", T_BOOL, every_step),
    MEMBER("worked", T_BOOL, worked),
    MEMBER("suspended", T_BOOL, suspended),
    MEMBER("done", T_BOOL, done),
    MEMBER("fed", T_BOOL, fed),
    MEMBER("optimizer_seen", T_BOOL, opt_used),
    MEMBER("last_end", T_ULONGLONG, last_end),
    MEMBER("forwards_in_step", T_LONG, forwards_in_step),
    MEMBER("prefetched", T_ULONG, prefetched),
    {nullptr, 0, 0, 0, nullptr}};

PyObject* get_mode(PyObject* self, void*) { return new_ref(T(self)->mode); }

PyObject* get_pending(PyObject* self, void*) {
  Tracker* t = T(self);
  if (!t->pending_mode) Py_RETURN_NONE;
  return Py_BuildValue("(KKO)", t->pending_t0, t->pending_t1, t->pending_mode);
}

int set_pending(PyObject* self, PyObject* v, void*) {  // None, or (t0, t1, mode)
  Tracker* t = T(self);
  if (!v || v == Py_None) {
    Py_CLEAR(t->pending_mode);
    return 0;
  }
  unsigned long long t0, t1;
  if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 3 || !arg_u64(PyTuple_GET_ITEM(v, 0), &t0) ||
      !arg_u64(PyTuple_GET_ITEM(v, 1), &t1)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "pending is None or (t0, t1, mode)");
    return -1;
  }
  t->pending_t0 = t0;
  t->pending_t1 = t1;
  put(&t->pending_mode, PyTuple_GET_ITEM(v, 2));
  return 0;
}

PyObject* pair_or_none(PyObject* mode, unsigned long long at, bool mode_first) {
  if (!mode) Py_RETURN_NONE;
  return mode_first ? Py_BuildValue("(OK)", mode, at) : Py_BuildValue("(KO)", at, mode);
}
PyObject* get_mark(PyObject* self, void*) { return pair_or_none(T(self)->mark_mode, T(self)->mark_at, true); }
PyObject* get_candidate(PyObject* self, void*) { return pair_or_none(T(self)->cand_mode, T(self)->cand_at, false); }

PyObject* get_forward_end(PyObject* self, void*) {
  Tracker* t = T(self);
  if (!t->has_forward_end) Py_RETURN_NONE;
  return PyLong_FromUnsignedLongLong(t->forward_end);
}

// The type checks as functions (the C API's are macros).
int is_list(PyObject* o) { return PyList_Check(o); }
int is_set(PyObject* o) { return PySet_Check(o); }

// The object attributes Python may set: typed, never null (the reports rely on it).
// A callback is a callable or None; deleting it sets None. The sets and the list
// take a set (a list) and are never deleted.
template <size_t Offset>
PyObject*& slot_of(PyObject* self) {
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(self) + Offset);
}

template <size_t Offset>
PyObject* get_slot(PyObject* self, void*) {
  return new_ref(slot_of<Offset>(self));
}

template <size_t Offset>
int set_callback(PyObject* self, PyObject* v, void* name) {
  if (!v) v = Py_None;
  if (v != Py_None && !PyCallable_Check(v)) {
    PyErr_Format(PyExc_TypeError, "StepTracker.%s is a callable or None, not %.100s", static_cast<const char*>(name),
                 Py_TYPE(v)->tp_name);
    return -1;
  }
  put(&slot_of<Offset>(self), v);
  return 0;
}

template <size_t Offset, int (*Check)(PyObject*)>
int set_container(PyObject* self, PyObject* v, void* name) {
  const char* kind = Check == is_list ? "list" : "set";
  if (!v) {
    PyErr_Format(PyExc_AttributeError, "StepTracker.%s cannot be deleted", static_cast<const char*>(name));
    return -1;
  }
  if (!Check(v)) {
    PyErr_Format(PyExc_TypeError, "StepTracker.%s is a %s, not %.100s", static_cast<const char*>(name), kind,
                 Py_TYPE(v)->tp_name);
    return -1;
  }
  put(&slot_of<Offset>(self), v);
  return 0;
}

#define CALLBACK(name, field, doc) \
  {name, get_slot<offsetof(Tracker, field)>, set_callback<offsetof(Tracker, field)>, doc, const_cast<char*>(name)}
#define CONTAINER(name, field, check, doc)                                                              \
  {name, get_slot<offsetof(Tracker, field)>, set_container<offsetof(Tracker, field), check>, doc, \
   const_cast<char*>(name)}

PyGetSetDef getset[] = {
    CALLBACK("on_new_step", on_new_step, "on_new_step(previous_had_forward), or None"),
    CALLBACK("may_begin", may_begin, "may_begin() -> False where this process runs no loop, or None"),
    CALLBACK("guess", guess, "guess() -> the mode of a fetch whose work never showed, or None (train)"),
    CONTAINER("pending_more", pending_more, is_list, "(t0, t1) of fetches read ahead with the held-back one"),
    CONTAINER("optimizers_in_step", opt_in_step, is_set, "keys of the optimizers that stepped in this step"),
    CONTAINER("optimizers_before", opt_before, is_set, "keys of the optimizers that stepped in the step before"),
    CONTAINER("optimizers_known", opt_known, is_set, "keys of the optimizers this process made"),
    {"mode", get_mode, nullptr, "mode of the open step; None between loops", nullptr},
    {"pending", get_pending, set_pending, "(t0, t1, mode) of a held-back fetch, or None", nullptr},
    {"mark", get_mark, nullptr, "(mode, at): an eval step's mark, not yet written", nullptr},
    {"candidate", get_candidate, nullptr, "(at, mode): a possible step start, several optimizers", nullptr},
    {"forward_end", get_forward_end, nullptr, "a train forward ended and no loss was seen since", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// Every slot set before __init__ (which a subclass may skip, or `StepTracker.__new__`):
// the reports and the attributes read them without checking.
PyObject* tp_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* self = type->tp_alloc(type, 0);
  if (!self) return nullptr;
  Tracker* t = T(self);
  for (PyObject** callback : {&t->on_new_step, &t->may_begin, &t->guess}) *callback = new_ref(Py_None);
  t->every_step = 1;
  if (!reset(t)) Py_CLEAR(self);
  return self;
}

int tp_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"on_new_step", "may_begin", nullptr};
  PyObject *on_new_step = Py_None, *may_begin = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:StepTracker", const_cast<char**>(kw), &on_new_step,
                                   &may_begin))
    return -1;
  Tracker* t = T(self);
  if (set_callback<offsetof(Tracker, on_new_step)>(self, on_new_step, const_cast<char*>("on_new_step")) < 0 ||
      set_callback<offsetof(Tracker, may_begin)>(self, may_begin, const_cast<char*>("may_begin")) < 0)
    return -1;
  put(&t->guess, Py_None);
  t->background = t->worked = t->opt_used = 0;
  t->every_step = 1;
  return reset(t) ? 0 : -1;
}

int tp_traverse(PyObject* self, visitproc visit, void* arg) {
  Tracker* t = T(self);
  for (PyObject* o : {t->on_new_step, t->may_begin, t->guess, t->mode, t->pending_mode, t->pending_more, t->mark_mode,
                      t->cand_mode, t->opt_in_step, t->opt_before, t->opt_known, t->held_group, t->held_mode})
    Py_VISIT(o);
  return 0;
}

// Replaces a container slot by a new empty one (kept where none can be made).
void replace_empty(PyObject** slot, PyObject* empty) {
  if (empty) Py_XSETREF(*slot, empty);
  else PyErr_Clear();
}

// Breaks cycles, leaving a tracker whose reports still run: the callbacks and the mode
// None, the sets and the list new and empty (code that runs while a cycle is collected
// may still reach it; a container someone else holds is left as it is).
int tp_clear(PyObject* self) {
  Tracker* t = T(self);
  for (PyObject** o : {&t->pending_mode, &t->mark_mode, &t->cand_mode, &t->held_group, &t->held_mode}) Py_CLEAR(*o);
  for (PyObject** o : {&t->on_new_step, &t->may_begin, &t->guess, &t->mode}) put(o, Py_None);
  for (PyObject** set : {&t->opt_in_step, &t->opt_before, &t->opt_known}) replace_empty(set, PySet_New(nullptr));
  replace_empty(&t->pending_more, PyList_New(0));
  return 0;
}

void tp_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  Tracker* t = T(self);
  for (PyObject** o : {&t->on_new_step, &t->may_begin, &t->guess, &t->mode, &t->pending_mode, &t->pending_more,
                       &t->mark_mode, &t->cand_mode, &t->opt_in_step, &t->opt_before, &t->opt_known, &t->held_group,
                       &t->held_mode})
    Py_CLEAR(*o);
  type->tp_free(self);
}

PyTypeObject TrackerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

const char* const kReports[] = {"fetched", "exhausted", "forward_started", "forward_ended", "loss",
                                "backward_started", "backward_ended", "optimizer_used", "optimizer_started",
                                "optimizer_ended", "loop_started"};

}  // namespace


namespace reports {

PyTypeObject* g_native_type = nullptr;
unsigned int g_native_tag = 0;

bool look(PyObject* tracker) {
  PyTypeObject* type = Py_TYPE(tracker);
  if (!PyType_IsSubtype(type, &TrackerType)) return false;
  PyObject* base_dict = TrackerType.tp_dict;
  for (const char* name : kReports) {
    // a report's descriptor as the type resolves it; PyType_Lookup's own cache keys on the tag
    PyObject* mine = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), name);
    bool same = mine && mine == PyDict_GetItemString(base_dict, name);
    Py_XDECREF(mine);
    if (!same) {
      PyErr_Clear();
      return false;
    }
  }
  g_native_type = type;  // the tag, assigned by those lookups; 0 where the type has none (never cached)
  g_native_tag = version_tag(type);
  return true;
}

}  // namespace reports

bool add_step_tracker(PyObject* module) {
  g_train = PyUnicode_InternFromString("train");
  g_eval = PyUnicode_InternFromString("eval");
  g_ops_due = PyUnicode_InternFromString("ops_due");
  g_ops_step = PyUnicode_InternFromString("ops_step");
  g_by_hand = PyUnicode_InternFromString("by_hand");
  if (!g_train || !g_eval || !g_ops_due || !g_ops_step || !g_by_hand) return false;
  TrackerType.tp_name = "stepscope.core._native.StepTracker";
  TrackerType.tp_basicsize = sizeof(Tracker);
  TrackerType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  TrackerType.tp_new = tp_new;
  TrackerType.tp_init = tp_init;
  TrackerType.tp_dealloc = tp_dealloc;
  TrackerType.tp_traverse = tp_traverse;
  TrackerType.tp_clear = tp_clear;
  TrackerType.tp_methods = methods;
  TrackerType.tp_members = members;
  TrackerType.tp_getset = getset;
  TrackerType.tp_doc = "From phase reports to contiguous steps (integrations/_steps.py).";
  if (PyType_Ready(&TrackerType) < 0) return false;
  Py_INCREF(&TrackerType);
  return PyModule_AddObject(module, "StepTracker", reinterpret_cast<PyObject*>(&TrackerType)) == 0;
}

}  // namespace stepscope
