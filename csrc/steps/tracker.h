// The step tracker's state machine, internal to csrc/steps/ (steps.h is the part's
// public face): the Tracker object, the names it compares, and the functions its
// files share. machine.cc begins and ends steps, fetches.cc places the fetched
// batches and the loop's edges, reports.cc holds the typed reports (track::),
// methods.cc and pytype.cc the Python type around them.
//
// What every report runs (the held-Forward check, a phase span, slot updates) is
// inline here: a call across files would cost its cache lines each time, about a
// dozen times a step (bench/instructions.py --cache).
#pragma once

#include <Python.h>

#include <cstdint>

#include "common/pyint.h"
#include "record/recorder.h"

namespace stepscope {
namespace machine {

// Phase names are interned first (bindings/hot.cc): their ids are 0..5.
enum : uint32_t { kGetNext = 0, kForward = 1, kLoss = 2, kBackward = 3, kOptimizer = 4, kRecompute = 5 };

// Interned at add_step_tracker (pytype.cc).
extern PyObject* g_train;     // "train"
extern PyObject* g_eval;      // "eval"
extern PyObject* g_ops_due;   // "ops_due"
extern PyObject* g_ops_step;  // "ops_step"
extern PyObject* g_by_hand;   // "by_hand"
extern PyObject* g_marks;     // stepscope.core.annotations' namespace: is by_hand set?

extern PyTypeObject TrackerType;  // pytype.cc
extern PyMethodDef tracker_methods[];  // methods.cc

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
  char pass_in_open;  // a pass began inside an unfinished train step (its loop left by an exception, break)
  char pending_open;  // the held-back fetch is that pass's first: its work tells whether the step goes on
  char inner_pass;    // that pass is the iteration's own loader (train work on it): its end ends no step
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

inline bool same(PyObject* a, PyObject* b) {
  if (a == b) return true;
  if (!a || !b || !PyUnicode_Check(a) || !PyUnicode_Check(b)) return false;
  return PyUnicode_Compare(a, b) == 0;
}
inline bool is_train(PyObject* m) { return same(m, g_train); }
inline bool no_mode(Tracker* t) { return t->mode == Py_None; }
inline bool has_optimizer(Tracker* t) { return t->opt_used || PySet_GET_SIZE(t->opt_known) > 0; }

// Replaces an owned slot (value may be null).
inline void put(PyObject** slot, PyObject* value) {
  Py_XINCREF(value);
  Py_XSETREF(*slot, value);
}

inline void phase(uint32_t name, uint64_t t0, uint64_t t1) { record_span(kCatPhase, name, t0, t1); }

inline bool arg_u64(PyObject* o, unsigned long long* out) { return u64_of(o, out); }

// A forward (or a recomputed one) ended: its phase written, the step told.
inline bool forward_done(Tracker* t, PyObject* mode, unsigned long long t0, unsigned long long t1, uint32_t ph) {
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
// Out of line and cold (machine.cc): the check below is inline in every report.
bool write_held(Tracker* t);
inline bool flush_held(Tracker* t) { return __builtin_expect(t->held_group == nullptr, 1) || write_held(t); }

// Called once or twice a step from the other files (the fetch's mode at its commit, the
// optimizers' sets): inline, as they were when the machine was one file.

// callable(arg) or callable(), on a reference of its own: the call may replace the
// attribute that held it.
inline PyObject* call_held(PyObject* callable, PyObject* arg) {
  Py_INCREF(callable);
  PyObject* r = arg ? PyObject_CallOneArg(callable, arg) : PyObject_CallNoArgs(callable);
  Py_DECREF(callable);
  return r;
}

// A fetch's mode (new reference): as reported, or, where the fetch left it to
// its work (None) and that work never showed, the integration's guess now.
inline PyObject* mode_of(Tracker* t, PyObject* mode) {
  if (mode != Py_None) return new_ref(mode);
  if (t->guess == Py_None) return new_ref(g_train);
  return call_held(t->guess, nullptr);
}

// Empties pending_more (and pass_begun, pending_open).
inline bool clear_more(Tracker* t) {
  t->pass_begun = t->pending_open = 0;
  if (t->pending_more && PyList_CheckExact(t->pending_more) && PyList_GET_SIZE(t->pending_more) == 0) return true;
  PyObject* l = PyList_New(0);
  if (!l) return false;
  Py_XSETREF(t->pending_more, l);
  return true;
}

// Set operations on the tracker's sets hash and compare user keys (their __hash__ and
// __eq__ run Python that may replace the set): each holds the set it works on.
inline bool set_add(PyObject* set, PyObject* key) {
  Py_INCREF(set);
  int r = PySet_Add(set, key);
  Py_DECREF(set);
  return r == 0;
}

inline int set_contains(PyObject* set, PyObject* key) {
  Py_INCREF(set);
  int r = PySet_Contains(set, key);
  Py_DECREF(set);
  return r;
}

// --- machine.cc: steps begun and ended ----------------------------------------------------
bool reset(Tracker* t);       // a tracker between loops; the optimizers known kept
bool flush_mark(Tracker* t);  // writes an eval step's mark held back
bool begin(PyObject* self, PyObject* mode, unsigned long long at);
// Ends the open step at `at` (0: now); `thread`: the native id of the loop's thread when
// another thread ends it; `followed`: a step of the next loop began already.
bool end(PyObject* self, unsigned long long at, unsigned long long thread, bool followed = false);

// --- fetches.cc: the held-back fetch, phases starting, the loop's edges --------------------
bool drop_unworked(Tracker* t);
bool append_more(Tracker* t, unsigned long long t0, unsigned long long t1);
int both_train(Tracker* t, PyObject* a, PyObject* b);
bool commit_pending(PyObject* self, PyObject* shown);
bool commit_no_work(PyObject* self);
bool phase_start(PyObject* self, PyObject* mode, unsigned long long now, bool acting = false);
bool end_with_pending(PyObject* self, bool followed = false);
bool loop_started(PyObject* self);
bool loop_ended(PyObject* self, unsigned long long at);
bool close(PyObject* self, unsigned long long thread);
int another_loop(Tracker* t, PyObject* key);

}  // namespace machine
}  // namespace stepscope
