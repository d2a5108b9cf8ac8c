// The optimizer step's global pre and post hooks as C callables, for jobs that
// never import torch._dynamo: two Python frames a step fewer. Dynamo would see
// these as opaque (a graph break where a compiled function steps an optimizer),
// so integrations/torch swaps in its Python hooks, whose is_dynamo_compiling()
// check dynamo folds, the moment torch._dynamo is imported (nothing can trace
// before that import).
//
// hook(optimizer, args, kwargs) -> None: nothing while torch.export traces
// (`compiler._is_compiling_flag`) or for an optimizer other than the one asked
// for; else optimizer_began/optimizer_done(local, id(optimizer)) (loop.h). A
// failure goes to fail(exc), never to the optimizer step.
//
// Only the pre-hook is registered at first: torch runs the hooks inside its
// `Optimizer.step#` range, whose exit (hooks.cc) ends the step, so a post-hook
// would be one more call a step for nothing. A step that ran outside such a
// range (a torch that has none there) makes the pre-hook call need_post(), which
// registers the post-hook.
#include "torch/optimizer_hooks.h"

#include <cstddef>

#include "torch/loop.h"

namespace stepscope {
namespace {

struct Hook {
  PyObject_HEAD
  PyObject* local;
  PyObject* compiler;
  PyObject* fail;
  PyObject* need_post;  // pre-hook: called once if a step ran outside torch's range (no post-hook yet); null
  void* only;  // the one optimizer to time (its address, as id() gives it); null: every one
  int post;
  vectorcallfunc vectorcall;
};

Hook* H(PyObject* o) { return reinterpret_cast<Hook*>(o); }

PyObject* hook_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject*) {
  Hook* h = H(callable);
  if (PyVectorcall_NARGS(nargsf) < 1) Py_RETURN_NONE;
  PyObject* optimizer = args[0];
  if (h->only && static_cast<void*>(optimizer) != h->only) Py_RETURN_NONE;
  int exported = exporting(h->compiler);
  bool ok = exported == 0;
  bool in_range = true;
  if (ok) {
    PyObject* key = PyLong_FromVoidPtr(optimizer);  // id(optimizer)
    ok = key && (h->post ? optimizer_done(h->local, key) : optimizer_began(h->local, key, &in_range));
    Py_XDECREF(key);
  }
  if (!ok && PyErr_Occurred()) hand_error_to(h->fail);
  if (!in_range && h->need_post) {
    // No range will end this step: the post-hook is registered now (once), before
    // torch runs the post-hooks of this very step.
    PyObject* need = h->need_post;
    h->need_post = nullptr;
    PyObject* r = PyObject_CallNoArgs(need);
    Py_DECREF(need);
    if (!r) hand_error_to(h->fail);
    Py_XDECREF(r);
  }
  Py_RETURN_NONE;
}

PyObject** fields(PyObject* o, int i) {
  Hook* h = H(o);
  PyObject** all[] = {&h->local, &h->compiler, &h->fail, &h->need_post};
  return i < int(sizeof(all) / sizeof(all[0])) ? all[i] : nullptr;
}

int hook_traverse(PyObject* o, visitproc visit, void* arg) { return visit_fields(o, fields, visit, arg); }

int hook_clear(PyObject* o) { return clear_fields(o, fields); }

void hook_dealloc(PyObject* o) {
  PyObject_GC_UnTrack(o);
  hook_clear(o);
  PyObject_GC_Del(o);
}

PyTypeObject HookType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Set-up time (hooks registered), so its arguments are named.
PyObject* optimizer_hook(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"local", "compiler", "only", "fail", "post", "need_post", nullptr};
  PyObject* a[6] = {};
  a[5] = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|O:optimizer_hook", const_cast<char**>(names), &a[0], &a[1],
                                   &a[2], &a[3], &a[4], &a[5]))
    return nullptr;
  void* only = nullptr;
  if (a[2] != Py_None) {
    only = PyLong_AsVoidPtr(a[2]);
    if (!only && PyErr_Occurred()) return nullptr;
  }
  int post = PyObject_IsTrue(a[4]);
  if (post < 0) return nullptr;
  Hook* h = PyObject_GC_New(Hook, &HookType);
  if (!h) return nullptr;
  PyObject* need_post = a[5] != Py_None ? a[5] : nullptr;
  PyObject* values[] = {a[0], a[1], a[3], need_post};
  for (int i = 0; PyObject** f = fields(reinterpret_cast<PyObject*>(h), i); ++i) {
    Py_XINCREF(values[i]);
    *f = values[i];
  }
  h->only = only;
  h->post = post;
  h->vectorcall = hook_call;
  PyObject_GC_Track(h);
  return reinterpret_cast<PyObject*>(h);
}

PyMethodDef methods[] = {
    {"optimizer_hook", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(optimizer_hook)),
     METH_VARARGS | METH_KEYWORDS,
     "optimizer_hook(local, compiler, only, fail, post, need_post=None): a global optimizer step pre-hook "
     "(post False) or post-hook in C (csrc/torch/optimizer_hooks.cc); only: id() of the one optimizer to time, or "
     "None; need_post: called once by the pre-hook if a step ran outside torch's Optimizer.step# range"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool add_optimizer_hooks(PyObject* module) {
  if (!ready_wrapper_type(&HookType, "stepscope.core._native.torch.OptimizerHook", sizeof(Hook), offsetof(Hook, vectorcall),
                          hook_traverse, hook_clear, hook_dealloc,
                          "An optimizer step's pre or post hook (csrc/torch/optimizer_hooks.cc)."))
    return false;
  return PyModule_AddFunctions(module, methods) == 0;
}

}  // namespace stepscope
