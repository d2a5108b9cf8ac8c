// The StepTracker type's methods (pytype.cc): argument checks around the typed
// reports (reports.cc) and the state machine's other entry points.
#include "steps/steps.h"
#include "steps/tracker.h"

namespace stepscope {
namespace machine {
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

}  // namespace

#define FAST(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(f)), METH_FASTCALL
PyMethodDef tracker_methods[] = {
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

}  // namespace machine
}  // namespace stepscope
