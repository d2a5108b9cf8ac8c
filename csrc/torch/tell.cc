// The native hooks' reports to the thread's tracker (tell.h).
#include "torch/tell.h"

#include <utility>

#include "steps/steps.h"

namespace stepscope {
namespace tell {
namespace {

PyObject *g_fetched, *g_exhausted, *g_forward_started, *g_forward_ended, *g_loss, *g_backward_started,
    *g_backward_ended, *g_optimizer_used, *g_optimizer_started, *g_optimizer_ended, *g_loop_started;

// tracker.<method>(args...) through its type: the way a replaced report is reached.
template <class... Args>
bool call(PyObject* tracker, PyObject* method, Args... args) {
  PyObject* argv[] = {tracker, args...};
  PyObject* r = PyObject_VectorcallMethod(method, argv, sizeof...(Args) + 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                          nullptr);
  Py_XDECREF(r);
  return r != nullptr;
}

// A tick (or a flag) as the int a Python method takes, released after the call.
struct Int {
  PyObject* o;
  explicit Int(unsigned long long v) : o(PyLong_FromUnsignedLongLong(v)) {}
  ~Int() { Py_XDECREF(o); }
};

// Runs fast(tracker) or slow(tracker) on a reference of its own to the state's tracker.
template <class Fast, class Slow>
bool report(LoopState* st, Fast fast, Slow slow) {
  PyObject* tracker = st->tracker;
  if (!tracker) {
    PyErr_SetString(PyExc_AttributeError, "the loop state has no tracker");
    return false;
  }
  Py_INCREF(tracker);
  bool ok = native_reports(tracker) ? fast(tracker) : slow(tracker);
  Py_DECREF(tracker);
  return ok;
}

}  // namespace

bool fetched(LoopState* st, unsigned long long t0, unsigned long long t1, PyObject* mode) {
  return report(
      st, [&](PyObject* t) { return track::fetched(t, t0, t1, mode); },
      [&](PyObject* t) {
        Int a(t0), b(t1);
        return a.o && b.o && call(t, g_fetched, a.o, b.o, mode);
      });
}

bool exhausted(LoopState* st, unsigned long long t0, unsigned long long t1) {
  return report(
      st, [&](PyObject* t) { return track::exhausted(t, t0, t1); },
      [&](PyObject* t) {
        Int a(t0), b(t1);
        return a.o && b.o && call(t, g_exhausted, a.o, b.o);
      });
}

bool forward_started(LoopState* st, PyObject* mode, unsigned long long now, PyObject* group, PyObject* part,
                     bool acting) {
  return report(
      st, [&](PyObject* t) { return track::forward_started(t, mode, now, group, part, acting); },
      [&](PyObject* t) {
        Int a(now);
        return a.o && call(t, g_forward_started, mode, a.o);
      });
}

bool forward_ended(LoopState* st, PyObject* mode, unsigned long long t0, unsigned long long t1, PyObject* phase,
                   PyObject* group, PyObject* part) {
  return report(
      st,
      [&](PyObject* t) {
        long id = PyLong_AsLong(phase);
        return !(id == -1 && PyErr_Occurred()) && track::forward_ended(t, mode, t0, t1, uint32_t(id), group, part);
      },
      [&](PyObject* t) {
        Int a(t0), b(t1);
        return a.o && b.o && call(t, g_forward_ended, mode, a.o, b.o, phase);
      });
}

bool loss(LoopState* st, unsigned long long t0, unsigned long long t1) {
  return report(
      st, [&](PyObject* t) { return track::loss(t, t0, t1); },
      [&](PyObject* t) {
        Int a(t0), b(t1);
        return a.o && b.o && call(t, g_loss, a.o, b.o);
      });
}

bool backward_started(LoopState* st, unsigned long long now, bool begins_step) {
  return report(
      st, [&](PyObject* t) { return track::backward_started(t, now, begins_step); },
      [&](PyObject* t) {
        Int a(now);
        return a.o && call(t, g_backward_started, a.o, begins_step ? Py_True : Py_False);
      });
}

bool backward_ended(LoopState* st, unsigned long long t0, unsigned long long t1) {
  return report(
      st, [&](PyObject* t) { return track::backward_ended(t, t0, t1); },
      [&](PyObject* t) {
        Int a(t0), b(t1);
        return a.o && b.o && call(t, g_backward_ended, a.o, b.o);
      });
}

bool optimizer_used(LoopState* st) {
  return report(
      st, [&](PyObject* t) { return track::optimizer_used(t); },
      [&](PyObject* t) { return call(t, g_optimizer_used); });
}

bool optimizer_started(LoopState* st, PyObject* key, unsigned long long now) {
  return report(
      st, [&](PyObject* t) { return track::optimizer_started(t, key, now); },
      [&](PyObject* t) {
        Int a(now);
        return a.o && call(t, g_optimizer_started, key, a.o);
      });
}

bool optimizer_ended(LoopState* st, PyObject* key, unsigned long long t0, unsigned long long t1) {
  return report(
      st, [&](PyObject* t) { return track::optimizer_ended(t, key, t0, t1); },
      [&](PyObject* t) {
        Int a(t0), b(t1);
        return a.o && b.o && call(t, g_optimizer_ended, key, a.o, b.o);
      });
}

bool loop_started(LoopState* st) {
  return report(
      st, [&](PyObject* t) { return track::loop_started(t); }, [&](PyObject* t) { return call(t, g_loop_started); });
}

bool init() {
  for (auto [slot, text] : {std::pair{&g_fetched, "fetched"}, {&g_exhausted, "exhausted"},
                            {&g_forward_started, "forward_started"}, {&g_forward_ended, "forward_ended"},
                            {&g_loss, "loss"}, {&g_backward_started, "backward_started"},
                            {&g_backward_ended, "backward_ended"}, {&g_optimizer_used, "optimizer_used"},
                            {&g_optimizer_started, "optimizer_started"}, {&g_optimizer_ended, "optimizer_ended"},
                            {&g_loop_started, "loop_started"}}) {
    *slot = PyUnicode_InternFromString(text);
    if (!*slot) return false;
  }
  return true;
}

}  // namespace tell
}  // namespace stepscope
