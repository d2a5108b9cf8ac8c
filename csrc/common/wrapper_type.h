// The CPython glue every native wrapper type shares (common/around.cc, the
// torch wrappers in csrc/torch/): GC support from a field list, readying a
// vectorcall wrapper type, and errors that a wrapper hands on, never raises.
#pragma once

#include <Python.h>

namespace stepscope {

// GC support of a native type whose object fields `fields(self, i)` lists
// (NULL after the last): its tp_traverse and tp_clear.
using FieldList = PyObject** (*)(PyObject* self, int i);
inline int visit_fields(PyObject* self, FieldList fields, visitproc visit, void* arg) {
  for (int i = 0; PyObject** field = fields(self, i); ++i) Py_VISIT(*field);
  return 0;
}
inline int clear_fields(PyObject* self, FieldList fields) {
  for (int i = 0; PyObject** field = fields(self, i); ++i) Py_CLEAR(*field);
  return 0;
}

// Readies a native wrapper's type (roots.cc, hooks.cc, optimizer_hooks.cc, passes.cc):
// a GC-tracked callable whose instances hold their vectorcall at `vectorcall_offset`.
// Slots of its own (tp_descr_get) are set before. False with a Python error set.
inline bool ready_wrapper_type(PyTypeObject* type, const char* name, Py_ssize_t size, Py_ssize_t vectorcall_offset,
                               traverseproc traverse, inquiry clear, destructor dealloc, const char* doc) {
  type->tp_name = name;
  type->tp_basicsize = size;
  type->tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  type->tp_vectorcall_offset = vectorcall_offset;
  type->tp_call = PyVectorcall_Call;
  type->tp_traverse = traverse;
  type->tp_clear = clear;
  type->tp_dealloc = dealloc;
  type->tp_doc = doc;
  return PyType_Ready(type) == 0;
}

// Hands the current Python error to fail(exc), never to the caller.
inline void hand_error_to(PyObject* fail) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject* r = value && fail ? PyObject_CallOneArg(fail, value) : nullptr;
  if (!r) PyErr_Clear();
  Py_XDECREF(r);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

// What a wrapped call raised, held aside while the hook reports (a report may
// raise and hand its own error on); given back, unchanged, when the hook returns.
// Nothing raised (most calls): no fetch and restore, and whatever a report left
// is cleared, so that a call that returned a value returns it with no error set.
class HeldError {
 public:
  HeldError() {
    if (PyErr_Occurred()) PyErr_Fetch(&type_, &value_, &tb_);
  }
  ~HeldError() {
    if (type_) PyErr_Restore(type_, value_, tb_);
    else if (PyErr_Occurred()) PyErr_Clear();
  }
  HeldError(const HeldError&) = delete;
  HeldError& operator=(const HeldError&) = delete;

 private:
  PyObject *type_ = nullptr, *value_ = nullptr, *tb_ = nullptr;
};

}  // namespace stepscope
