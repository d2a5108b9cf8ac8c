// The step tracker's state machine, first part: steps begun and ended (begin, end,
// reset) and what they call out to (the integration's callbacks, the operator
// windows' schedule). The rules are documented where integrations meet it,
// integrations/_steps.py, whose StepTracker subclasses this type (pytype.cc).
//
// Why native: it runs a dozen times in every training step, between torch's own
// work, where each Python frame of bookkeeping costs about a microsecond of
// cache misses (BENCHMARKS.md, bench/overhead.py). Here each report is one C
// call that records its phase span directly.
#include <algorithm>

#include "steps/steps.h"
#include "steps/tracker.h"

namespace stepscope {
namespace machine {

PyObject* g_train = nullptr;
PyObject* g_eval = nullptr;
PyObject* g_ops_due = nullptr;
PyObject* g_ops_step = nullptr;
PyObject* g_by_hand = nullptr;
PyObject* g_marks = nullptr;

namespace {

// Whether r (a new reference, or null after an error) is true: 1, 0, or -1 on error.
int truth_of(PyObject* r) {
  if (!r) return -1;
  int yes = PyObject_IsTrue(r);
  Py_DECREF(r);
  return yes;
}

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


// A train step that ends without its optimizer step (with no optimizer, its backward):
// an exception or Ctrl-C inside the iteration, a last accumulation window never stepped.
// Its time stays on the timeline, flagged interrupted: no train step (SPEC §3). Only
// once a train step of this thread completed: where none ever does, the completion is
// what stepscope cannot see (a loop note says so), not an interruption.
inline void flag_unfinished(Tracker* t) {
  if (!no_mode(t) && is_train(t->mode) && !t->done && t->finished && !t->suspended) interrupt_step(0);
}

}  // namespace

bool reset(Tracker* t) {
  ++t->resets;
  Py_CLEAR(t->held_group);
  Py_CLEAR(t->held_mode);
  t->suspended = t->done = t->fed = t->has_forward_end = 0;
  t->pass_in_open = t->pending_open = t->inner_pass = 0;
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

// Out of line and cold: flush_held's check is inline in every report (a call each
// would cost its cache lines ~12 times a step; bench/instructions.py --cache).
__attribute__((noinline, cold)) bool write_held(Tracker* t) {
  PyObject* mode = t->held_mode;  // owned from here
  t->held_mode = nullptr;
  Py_CLEAR(t->held_group);
  bool ok = forward_done(t, mode, t->held_t0, t->held_t1, kForward);
  Py_DECREF(mode);
  return ok;
}

bool flush_mark(Tracker* t) {
  if (!t->mark_mode) return true;
  PyObject* mode = t->mark_mode;
  t->mark_mode = nullptr;
  int32_t n;
  bool ok = begin_step_of(mode, t->mark_at, &n);
  Py_DECREF(mode);
  return ok;
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
  t->pass_in_open = t->inner_pass = 0;
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

}  // namespace machine
}  // namespace stepscope
