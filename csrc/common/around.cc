// around(original, before, after, fail): a wrapper that leaves no frame in a
// traceback. A Python wrapper's frame shows in every traceback that passes
// through it, and Keras's traceback filter keeps it while dropping the frame
// that raised (issue 47): wrappers of a framework's user-facing calls are C.
//
//   prepared = before(*args, **kwargs)
//     None: original(*args, **kwargs) is called as is, nothing after it;
//     (args, kwargs or None, token): original(*args, **kwargs) with those,
//     then after(token, exc): exc is what original raised, or None;
//     around(..., fail, True): after(token, exc, result), result what original
//     returned (None where it raised).
//
// A failure of before or after goes to fail(exc) and never to the caller
// (before failing: the original is called with the caller's arguments);
// whatever original raises, or returns, reaches the caller unchanged.
// Set on a class it binds to instances as a function does; read from the class
// itself it is `original` (as hooks.cc's wrappers).
#include "common/around.h"
#include "common/wrapper_type.h"

#include <cstddef>

namespace stepscope {
namespace {

struct Around {
  PyObject_HEAD
  PyObject* original;
  PyObject* before;
  PyObject* after;
  PyObject* fail;
  vectorcallfunc vectorcall;
  bool with_result;  // after(token, exc, result)
};

PyObject** around_fields(PyObject* self, int i) {
  Around* a = reinterpret_cast<Around*>(self);
  PyObject** fields[] = {&a->original, &a->before, &a->after, &a->fail};
  return i < 4 ? fields[i] : nullptr;
}

int around_traverse(PyObject* self, visitproc visit, void* arg) {
  return visit_fields(self, around_fields, visit, arg);
}

int around_clear(PyObject* self) { return clear_fields(self, around_fields); }

void around_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  around_clear(self);
  PyObject_GC_Del(self);
}

// The prepared call: (args tuple, kwargs dict or None, token); false: not that shape.
bool unpack(PyObject* prepared, PyObject** args, PyObject** kwargs, PyObject** token) {
  if (!PyTuple_CheckExact(prepared) || PyTuple_GET_SIZE(prepared) != 3) return false;
  *args = PyTuple_GET_ITEM(prepared, 0);
  *kwargs = PyTuple_GET_ITEM(prepared, 1);
  *token = PyTuple_GET_ITEM(prepared, 2);
  if (*kwargs == Py_None) *kwargs = nullptr;
  return PyTuple_Check(*args) && (!*kwargs || PyDict_Check(*kwargs));
}

PyObject* around_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Around* a = reinterpret_cast<Around*>(callable);
  PyObject* prepared = PyObject_Vectorcall(a->before, args, nargsf, kwnames);
  PyObject *call_args, *call_kwargs, *token;
  if (!prepared || prepared == Py_None || !unpack(prepared, &call_args, &call_kwargs, &token)) {
    if (!prepared) {
      hand_error_to(a->fail);
    } else if (prepared != Py_None) {
      PyErr_SetString(PyExc_TypeError, "around: before() returns None or (args, kwargs, token)");
      hand_error_to(a->fail);
    }
    Py_XDECREF(prepared);
    return PyObject_Vectorcall(a->original, args, nargsf, kwnames);
  }
  PyObject* result = PyObject_Call(a->original, call_args, call_kwargs);
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  if (!result) {  // held aside while after runs, then given back unchanged
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
  }
  PyObject* r = a->with_result ? PyObject_CallFunctionObjArgs(a->after, token, value ? value : Py_None,
                                                              result ? result : Py_None, nullptr)
                               : PyObject_CallFunctionObjArgs(a->after, token, value ? value : Py_None, nullptr);
  if (!r) hand_error_to(a->fail);
  Py_XDECREF(r);
  if (type) PyErr_Restore(type, value, tb);
  Py_DECREF(prepared);
  return result;
}

PyObject* around_get(PyObject* self, PyObject* obj, PyObject*) {
  if (!obj || obj == Py_None) {
    PyObject* original = reinterpret_cast<Around*>(self)->original;
    Py_INCREF(original);
    return original;
  }
  return PyMethod_New(self, obj);
}

PyObject* get_original(PyObject* self, void*) {
  PyObject* original = reinterpret_cast<Around*>(self)->original;
  Py_INCREF(original);
  return original;
}

// Any other attribute is the original's (__name__, __qualname__, __doc__...): code that
// inspects a method (TensorFlow's autograph, functools, pickling by reference) sees it.
PyObject* around_getattro(PyObject* self, PyObject* name) {
  PyObject* found = PyObject_GenericGetAttr(self, name);
  if (found || !PyErr_ExceptionMatches(PyExc_AttributeError)) return found;
  PyErr_Clear();
  return PyObject_GetAttr(reinterpret_cast<Around*>(self)->original, name);
}

PyObject* get_doc(PyObject* self, void*) {
  return PyObject_GetAttrString(reinterpret_cast<Around*>(self)->original, "__doc__");
}

PyGetSetDef around_getset[] = {
    {"__doc__", get_doc, nullptr, nullptr, nullptr},
    {"__stepscope_original__", get_original, nullptr, "the wrapped callable", nullptr},
    {"__wrapped__", get_original, nullptr, "the wrapped callable (inspect.signature follows it)", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject AroundType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* around(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if ((n != 4 && n != 5) || !PyCallable_Check(a[0]) || !PyCallable_Check(a[1]) || !PyCallable_Check(a[2]) ||
      !PyCallable_Check(a[3])) {
    PyErr_SetString(PyExc_TypeError, "around(original, before, after, fail[, with_result]): four callables");
    return nullptr;
  }
  int with_result = n == 5 ? PyObject_IsTrue(a[4]) : 0;
  if (with_result < 0) return nullptr;
  Around* w = PyObject_GC_New(Around, &AroundType);
  if (!w) return nullptr;
  PyObject** slots[] = {&w->original, &w->before, &w->after, &w->fail};
  for (int i = 0; i < 4; ++i) {
    Py_INCREF(a[i]);
    *slots[i] = a[i];
  }
  w->vectorcall = around_call;
  w->with_result = with_result != 0;
  PyObject_GC_Track(w);
  return reinterpret_cast<PyObject*>(w);
}

PyMethodDef functions[] = {
    {"around", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(around)), METH_FASTCALL,
     "around(original, before, after, fail[, with_result]): a wrapper with no Python frame; see "
     "csrc/common/around.cc"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool add_around(PyObject* module) {
  AroundType.tp_descr_get = around_get;
  AroundType.tp_getset = around_getset;
  AroundType.tp_getattro = around_getattro;
  if (!ready_wrapper_type(&AroundType, "stepscope.core._native.Around", sizeof(Around), offsetof(Around, vectorcall),
                          around_traverse, around_clear, around_dealloc,
                          "A wrapper that leaves no frame in tracebacks (around)."))
    return false;
  return PyModule_AddFunctions(module, functions) == 0;
}

}  // namespace stepscope
