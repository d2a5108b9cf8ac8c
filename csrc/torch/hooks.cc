// The Hook type: a method wrapper torch's patched functions share (hook_type.h),
// made by filtered_enter and guarded_exit (record_function.cc) and timed_backward
// (backward.cc), and its set-up.
//
// Set on a class, a Hook binds to instances as functions do; read from the class
// itself it is `original` (TorchScript compiles a class from its functions'
// source, and finds them through the class).
#include "torch/hooks.h"

#include <cstddef>
#include <utility>

#include "common/wrapper_type.h"
#include "steps/steps.h"
#include "torch/hook_type.h"

namespace stepscope {
namespace hook {
namespace {

int hook_traverse(PyObject* o, visitproc visit, void* arg) {
  Hook* h = reinterpret_cast<Hook*>(o);
  Py_VISIT(h->original);
  Py_VISIT(h->record);
  Py_VISIT(h->prefixes);
  Py_VISIT(h->local);
  Py_VISIT(h->fail);
  Py_VISIT(h->state);
  Py_VISIT(h->fetches);
  Py_VISIT(h->zero_grads);
  Py_VISIT(h->optimizer_steps);
  Py_VISIT(h->compiler);
  for (PyObject* seen : h->seen_names) Py_VISIT(seen);
  return 0;
}

int hook_clear(PyObject* o) {
  Hook* h = reinterpret_cast<Hook*>(o);
  Py_CLEAR(h->original);
  Py_CLEAR(h->record);
  Py_CLEAR(h->prefixes);
  Py_CLEAR(h->local);
  Py_CLEAR(h->fail);
  Py_CLEAR(h->state);
  Py_CLEAR(h->fetches);
  Py_CLEAR(h->zero_grads);
  Py_CLEAR(h->optimizer_steps);
  Py_CLEAR(h->compiler);
  for (PyObject*& seen : h->seen_names) Py_CLEAR(seen);
  return 0;
}

void hook_dealloc(PyObject* o) {
  PyObject_GC_UnTrack(o);
  hook_clear(o);
  PyObject_GC_Del(o);
}

PyTypeObject HookType = {PyVarObject_HEAD_INIT(nullptr, 0)};
// Bound to an instance: a method of the hook; seen from the class: the original.
PyObject* hook_get(PyObject* self, PyObject* obj, PyObject*) {
  if (!obj || obj == Py_None) {
    PyObject* original = reinterpret_cast<Hook*>(self)->original;
    Py_INCREF(original);
    return original;
  }
  return PyMethod_New(self, obj);
}

#define KEYWORDS(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(f)), METH_VARARGS | METH_KEYWORDS
PyMethodDef functions[] = {
    {"filtered_enter", KEYWORDS(filtered_enter),
     "filtered_enter(original, record, prefixes, fail, loop=None): an __enter__ that calls record(self.name, "
     "id(self)) after original, unless the name starts with one of prefixes; loop: see csrc/torch/record_function.cc"},
    {"guarded_exit", KEYWORDS(guarded_exit),
     "guarded_exit(original, record, local, fail, loop=None): an __exit__ that calls record(id(self)) when "
     "local.stack is non-empty, then original; loop: see csrc/torch/record_function.cc"},
    {"timed_backward", KEYWORDS(timed_backward),
     "timed_backward(original, state, compiler, fail): the engine call of every backward, timed for the "
     "thread's tracker (state.s)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool str_tuple(PyObject* o) {
  if (!PyTuple_Check(o)) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); ++i)
    if (!PyUnicode_Check(PyTuple_GET_ITEM(o, i))) return false;
  return true;
}

PyObject* make(PyObject* original, PyObject* record, PyObject* prefixes, PyObject* local, PyObject* fail,
               PyObject* loop, vectorcallfunc call) {
  if (!PyCallable_Check(original) || !PyCallable_Check(record) || !PyCallable_Check(fail)) {
    PyErr_SetString(PyExc_TypeError, "original, record and fail must be callable");
    return nullptr;
  }
  PyObject *state = nullptr, *fetches = nullptr, *zero_grads = nullptr, *optimizer_steps = nullptr;
  unsigned int category = 0, span_name = 0;
  if (loop && loop != Py_None &&
      !(PyTuple_Check(loop) &&
        PyArg_ParseTuple(loop, "OO!O!II|O!:loop", &state, &PyTuple_Type, &fetches, &PyTuple_Type, &zero_grads,
                         &category, &span_name, &PyTuple_Type, &optimizer_steps) &&
        str_tuple(fetches) && str_tuple(zero_grads) && (!optimizer_steps || str_tuple(optimizer_steps)) &&
        category < 256 && check_name_id(span_name))) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_TypeError, "loop is (state, fetches: tuple of str, zero_grads: tuple of str, "
                                       "category, name[, optimizer_steps: tuple of str])");
    return nullptr;
  }
  Hook* h = PyObject_GC_New(Hook, &HookType);
  if (!h) return nullptr;
  for (auto [slot, value] : {std::pair{&h->original, original}, {&h->record, record}, {&h->prefixes, prefixes},
                             {&h->local, local}, {&h->fail, fail}, {&h->state, state}, {&h->fetches, fetches},
                             {&h->zero_grads, zero_grads}, {&h->optimizer_steps, optimizer_steps}}) {
    Py_XINCREF(value);
    *slot = value;
  }
  h->category = uint8_t(category);
  h->span_name = span_name;
  h->compiler = nullptr;
  h->vectorcall = call;
  for (PyObject*& seen : h->seen_names) seen = nullptr;
  h->seen_next = 0;
  PyObject_GC_Track(h);
  return reinterpret_cast<PyObject*>(h);
}

}  // namespace hook

bool add_hooks(PyObject* module) {
  using namespace hook;
  if (!record_function_ready()) return false;
  HookType.tp_descr_get = hook_get;
  if (!ready_wrapper_type(&HookType, "stepscope.core._native.torch.Hook", sizeof(Hook), offsetof(Hook, vectorcall),
                          hook_traverse, hook_clear, hook_dealloc, "A method wrapper (filtered_enter, guarded_exit, timed_backward)."))
    return false;
  return PyModule_AddFunctions(module, functions) == 0;
}

}  // namespace stepscope
