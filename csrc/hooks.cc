// Method wrappers for context managers a framework enters on every step of a
// training loop (torch's record_function: optimizer step, zero_grad, each
// DataLoader fetch). Written in C because a Python wrapper frame costs about a
// microsecond there, three times a step on each side, to pass over ranges that
// are not the user's (BENCHMARKS.md, bench/overhead.py).
//
//   filtered_enter(original, record, prefixes, fail): __enter__(self, ...) calls
//     original, then record(self.name, id(self)) unless the name is a str
//     starting with one of `prefixes`.
//   guarded_exit(original, record, local, fail): __exit__(self, ...) calls
//     record(id(self)) when `local.stack` is non-empty, then original.
//
// Set on a class, both bind to instances as functions do; read from the class
// itself they are `original` (TorchScript compiles a class from its functions'
// source, and finds them through the class). A failure of `record` goes to
// fail(exc) and never to the caller; whatever `original` raises, or returns,
// reaches the caller unchanged.
#include "hooks.h"

#include <cstddef>
#include <utility>

namespace stepscope {
namespace {

struct Hook {
  PyObject_HEAD
  PyObject* original;
  PyObject* record;
  PyObject* prefixes;  // filtered_enter: tuple of str
  PyObject* local;     // guarded_exit: holds .stack
  PyObject* fail;
  vectorcallfunc vectorcall;
};

PyObject* g_name = nullptr;
PyObject* g_stack = nullptr;

// record(...) failed: hand the exception to fail(exc), never to the caller.
void report(Hook* h) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject* r = value ? PyObject_CallOneArg(h->fail, value) : nullptr;
  if (!r) PyErr_Clear();
  Py_XDECREF(r);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

bool passed_over(PyObject* name, PyObject* prefixes) {
  if (!PyUnicode_CheckExact(name)) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); ++i) {
    Py_ssize_t r = PyUnicode_Tailmatch(name, PyTuple_GET_ITEM(prefixes, i), 0, PY_SSIZE_T_MAX, -1);
    if (r == 1) return true;
    if (r < 0) PyErr_Clear();
  }
  return false;
}

PyObject* enter_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Hook* h = reinterpret_cast<Hook*>(callable);
  PyObject* result = PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  if (!result || PyVectorcall_NARGS(nargsf) < 1) return result;
  PyObject* self = args[0];
  PyObject* name = PyObject_GetAttr(self, g_name);
  if (!name) {
    report(h);
    return result;
  }
  if (!passed_over(name, h->prefixes)) {
    PyObject* key = PyLong_FromVoidPtr(self);
    PyObject* r = key ? PyObject_CallFunctionObjArgs(h->record, name, key, nullptr) : nullptr;
    Py_XDECREF(key);
    if (r) Py_DECREF(r);
    else report(h);
  }
  Py_DECREF(name);
  return result;
}

PyObject* exit_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Hook* h = reinterpret_cast<Hook*>(callable);
  if (PyVectorcall_NARGS(nargsf) >= 1) {
    PyObject* stack = PyObject_GetAttr(h->local, g_stack);
    int open = stack ? PyObject_IsTrue(stack) : 0;
    Py_XDECREF(stack);
    if (!stack || open < 0) PyErr_Clear();  // no range opened on this thread: torch's own
    if (open == 1) {
      PyObject* key = PyLong_FromVoidPtr(args[0]);
      PyObject* r = key ? PyObject_CallOneArg(h->record, key) : nullptr;
      Py_XDECREF(key);
      if (r) Py_DECREF(r);
      else report(h);
    }
  }
  return PyObject_Vectorcall(h->original, args, nargsf, kwnames);
}

int hook_traverse(PyObject* o, visitproc visit, void* arg) {
  Hook* h = reinterpret_cast<Hook*>(o);
  Py_VISIT(h->original);
  Py_VISIT(h->record);
  Py_VISIT(h->prefixes);
  Py_VISIT(h->local);
  Py_VISIT(h->fail);
  return 0;
}

int hook_clear(PyObject* o) {
  Hook* h = reinterpret_cast<Hook*>(o);
  Py_CLEAR(h->original);
  Py_CLEAR(h->record);
  Py_CLEAR(h->prefixes);
  Py_CLEAR(h->local);
  Py_CLEAR(h->fail);
  return 0;
}

void hook_dealloc(PyObject* o) {
  PyObject_GC_UnTrack(o);
  hook_clear(o);
  PyObject_GC_Del(o);
}

PyTypeObject HookType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* make(PyObject* original, PyObject* record, PyObject* prefixes, PyObject* local, PyObject* fail,
               vectorcallfunc call) {
  if (!PyCallable_Check(original) || !PyCallable_Check(record) || !PyCallable_Check(fail)) {
    PyErr_SetString(PyExc_TypeError, "original, record and fail must be callable");
    return nullptr;
  }
  Hook* h = PyObject_GC_New(Hook, &HookType);
  if (!h) return nullptr;
  for (auto [slot, value] : {std::pair{&h->original, original}, {&h->record, record}, {&h->prefixes, prefixes},
                             {&h->local, local}, {&h->fail, fail}}) {
    Py_XINCREF(value);
    *slot = value;
  }
  h->vectorcall = call;
  PyObject_GC_Track(h);
  return reinterpret_cast<PyObject*>(h);
}

// Bound to an instance: a method of the hook; seen from the class: the original.
PyObject* hook_get(PyObject* self, PyObject* obj, PyObject*) {
  if (!obj || obj == Py_None) {
    PyObject* original = reinterpret_cast<Hook*>(self)->original;
    Py_INCREF(original);
    return original;
  }
  return PyMethod_New(self, obj);
}

PyObject* filtered_enter(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 4 || !PyTuple_Check(a[2])) {
    PyErr_SetString(PyExc_TypeError, "filtered_enter(original, record, prefixes: tuple, fail)");
    return nullptr;
  }
  return make(a[0], a[1], a[2], nullptr, a[3], enter_call);
}

PyObject* guarded_exit(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 4) {
    PyErr_SetString(PyExc_TypeError, "guarded_exit(original, record, local, fail)");
    return nullptr;
  }
  return make(a[0], a[1], nullptr, a[2], a[3], exit_call);
}

#define FAST(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(f)), METH_FASTCALL
PyMethodDef functions[] = {
    {"filtered_enter", FAST(filtered_enter),
     "filtered_enter(original, record, prefixes, fail): an __enter__ that calls record(self.name, id(self)) "
     "after original, unless the name starts with one of prefixes"},
    {"guarded_exit", FAST(guarded_exit),
     "guarded_exit(original, record, local, fail): an __exit__ that calls record(id(self)) when "
     "local.stack is non-empty, then original"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool add_hooks(PyObject* module) {
  g_name = PyUnicode_InternFromString("name");
  g_stack = PyUnicode_InternFromString("stack");
  if (!g_name || !g_stack) return false;
  HookType.tp_name = "stepscope.core._native.Hook";
  HookType.tp_basicsize = sizeof(Hook);
  HookType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  HookType.tp_vectorcall_offset = offsetof(Hook, vectorcall);
  HookType.tp_call = PyVectorcall_Call;
  HookType.tp_descr_get = hook_get;
  HookType.tp_traverse = hook_traverse;
  HookType.tp_clear = hook_clear;
  HookType.tp_dealloc = hook_dealloc;
  HookType.tp_doc = "A method wrapper (filtered_enter, guarded_exit).";
  if (PyType_Ready(&HookType) < 0) return false;
  return PyModule_AddFunctions(module, functions) == 0;
}

}  // namespace stepscope
