// The engine call of every backward (torch.autograd.backward and grad end in
// it), timed; nested calls count once; a backward inside an optimizer step
// (LBFGS's closure) begins no step. Dynamo never runs it: it stops its graph at
// the backward before.
//
//   timed_backward(original, state, compiler, fail)
#include "common/wrapper_type.h"
#include "record/recorder.h"
#include "torch/hook_type.h"
#include "torch/tell.h"

namespace stepscope {
namespace hook {
namespace {

PyObject* backward_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Hook* h = reinterpret_cast<Hook*>(callable);
  LoopState* st = state_of(h);
  bool timed = st && !st->in_backward;
  if (timed) timed = exporting(h->compiler) == 0;
  if (!timed) {
    if (PyErr_Occurred()) report(h);
    Py_XDECREF(st);
    return PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  }
  unsigned long long t0 = ticks();
  // inside an optimizer step: no new step
  if (!st->depth && !tell::backward_started(st, t0, !st->in_optimizer)) report(h);
  st->in_backward = 1;
  PyObject* result = PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  {
    HeldError held;  // what the backward raised goes to the caller, unchanged
    st->in_backward = 0;
    if (!tell::backward_ended(st, t0, ticks())) report(h);
  }
  Py_DECREF(st);
  return result;
}

}  // namespace

PyObject* timed_backward(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"original", "state", "compiler", "fail", nullptr};
  PyObject *original, *state, *compiler, *fail;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:timed_backward", const_cast<char**>(names), &original, &state,
                                   &compiler, &fail))
    return nullptr;
  PyObject* h = make(original, fail, nullptr, nullptr, fail, nullptr, backward_call);
  if (h) {
    Hook* hook = reinterpret_cast<Hook*>(h);
    Py_INCREF(state);
    hook->state = state;
    Py_INCREF(compiler);
    hook->compiler = compiler;
  }
  return h;
}

}  // namespace hook
}  // namespace stepscope
