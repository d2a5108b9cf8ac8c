// The step tracker's reports, typed (steps.h): what the Python methods of the same
// names do, called directly by the native hooks (csrc/torch/tell.cc) where the type
// leaves them as they are (reports::look).
#include <algorithm>

#include "steps/steps.h"
#include "steps/tracker.h"

namespace stepscope {

using namespace machine;

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
  if (no_mode(t) || t->done || (t->pass_in_open && !t->pending_mode)) {
    t->pending_open = t->pass_in_open && !no_mode(t) && !t->done;
    t->pass_in_open = 0;
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
  if (t->inner_pass && !no_mode(t) && is_train(t->mode) && !t->done) {
    // the iteration's own loader ran out inside its step (loop_started, commit_pending): the
    // step goes on to its optimizer step
    t->inner_pass = 0;
    return true;
  }
  if (!no_mode(t)) {
    // The call that met the end of the data lies after its loop (SPEC §3): named, in no step
    if (!end(self, t0, 0)) return false;
    static const uint32_t end_of_data = intern("end of data");  // (vocabulary.END_OF_DATA)
    if (t1 > t0) record_span(kCatFramework, end_of_data, t0, t1);
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

bool loop_started(PyObject* self) { return machine::loop_started(self); }

}  // namespace track

namespace {

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

}  // namespace stepscope
