// The timed call of a root module (integrations/torch/_roots.py): what a root's
// `_compiled_call_impl` slot holds, so that nn.Module.__call__ reaches it on
// every forward. In C because it runs twice a step (the model, the loss) and a
// Python wrapper there cost ~13,000 instructions a step (callgrind,
// BENCHMARKS.md): its frame, the arguments packed again, and the loop state's
// fields read by name.
//
//   timed_root(ref, inner, call_impl, local, roots, is_grad_enabled, is_training,
//              compiler, fail, loss, phases=(forward, recompute), group=None)
//
// (stepscope.core._native.torch; every argument may be named: it runs once a root.)
//
// calls inner(*args, **kwargs), or call_impl(ref(), *args, **kwargs) when inner
// is None, and reports it to the calling thread's tracker (local.s.tracker):
// a model's call as forward_started(mode, t0) / forward_ended(mode, t0, t1,
// phase), a loss module's as loss(t0, t1); inside a backward both are
// Recompute. A call nested in a timed one (depth), or made while torch.export
// traces (compiler._is_compiling_flag), is passed through. Dynamo never calls
// the slot: it traces the module's _call_impl itself. Failures go to fail(exc);
// what the call returns or raises reaches the caller unchanged.
#include "torch/roots.h"

#include <cstring>

#include "common/clock.h"
#include "torch/loop.h"
#include "torch/tell.h"

namespace stepscope {
namespace {

struct Root {
  PyObject_HEAD
  PyObject* ref;  // weak reference to the module: no cycle through its own slot
  PyObject* inner;
  PyObject* call_impl;
  PyObject* local;
  PyObject* roots;
  PyObject* is_grad_enabled;
  PyObject* is_training;
  PyObject* compiler;
  PyObject* fail;
  PyObject* forward;    // phase ids
  PyObject* recompute;
  PyObject* group;      // a part of one forward the program calls directly (model.forward(x)); null: none
  int loss;
  vectorcallfunc vectorcall;
};

PyObject *g_training, *g_stop_at_known, *g_known_root_ran, *g_train, *g_eval;

Root* R(PyObject* o) { return reinterpret_cast<Root*>(o); }

void report(Root* r) { hand_error_to(r->fail); }

// The module behind the weak reference (a new reference), or NULL with an error set.
PyObject* module_of(Root* r) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* m;
  if (PyWeakref_GetRef(r->ref, &m) < 0) return nullptr;
#else
  PyObject* m = PyWeakref_GetObject(r->ref);  // borrowed
  if (!m) return nullptr;
  if (m == Py_None) m = nullptr;
  Py_XINCREF(m);
#endif
  if (!m) PyErr_SetString(PyExc_ReferenceError, "the root module is gone");
  return m;
}

// The original call: inner(*args, **kwargs) or call_impl(module, *args, **kwargs).
PyObject* call_through(Root* r, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (r->inner) return PyObject_Vectorcall(r->inner, args, nargsf, kwnames);
  PyObject* module = module_of(r);
  if (!module) return nullptr;
  size_t n = PyVectorcall_NARGS(nargsf);
  size_t total = n + (kwnames ? size_t(PyTuple_GET_SIZE(kwnames)) : 0);
  PyObject* small[10];
  PyObject** buf = total + 2 <= 10 ? small : static_cast<PyObject**>(PyMem_Malloc((total + 2) * sizeof(PyObject*)));
  if (!buf) {
    Py_DECREF(module);
    return PyErr_NoMemory();
  }
  buf[1] = module;  // buf[0]: the slot a callee may borrow (PY_VECTORCALL_ARGUMENTS_OFFSET)
  if (total) std::memcpy(buf + 2, args, total * sizeof(PyObject*));
  PyObject* result = PyObject_Vectorcall(r->call_impl, buf + 1, (n + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
  if (buf != small) PyMem_Free(buf);
  Py_DECREF(module);
  return result;
}

LoopState* state_of(Root* r) { return loop_state_of(r->local); }

// The mode of a model's forward: a framework loop's, else eval without grad, else the module's.
// *acting: eval only because grad is off, the module in training mode.
PyObject* mode_of(Root* r, LoopState* st, bool* acting) {
  *acting = false;
  PyObject* forced = st->forced_modes;
  if (forced && PyList_Check(forced) && PyList_GET_SIZE(forced) > 0) {
    PyObject* m = PyList_GET_ITEM(forced, PyList_GET_SIZE(forced) - 1);
    Py_INCREF(m);
    return m;
  }
  PyObject* grad = PyObject_CallNoArgs(r->is_grad_enabled);
  int enabled = grad ? PyObject_IsTrue(grad) : -1;
  Py_XDECREF(grad);
  if (enabled < 0) return nullptr;
  int training = 0;
  {  // (without grad, only for *acting: the module's own flag, no look through wrappers)
    PyObject* module = module_of(r);
    if (!module) return nullptr;
    PyObject* flag = PyObject_GetAttr(module, g_training);
    training = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(flag);
    if (training == 0 && enabled) {  // a wrapper (DDP, Lightning's) whose own flag may lag behind its model's
      PyObject* deep = PyObject_CallOneArg(r->is_training, module);
      training = deep ? PyObject_IsTrue(deep) : -1;
      Py_XDECREF(deep);
    }
    Py_DECREF(module);
    if (training < 0) return nullptr;
  }
  *acting = training && !enabled;
  PyObject* m = training && enabled ? g_train : g_eval;
  Py_INCREF(m);
  return m;
}

PyObject* root_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Root* r = R(callable);
  LoopState* st = state_of(r);
  int pass = !st || st->depth ? 1 : exporting(r->compiler);
  if (pass) {
    if (pass < 0 || !st) report(r);
    Py_XDECREF(st);
    return call_through(r, args, nargsf, kwnames);
  }
  ++st->depth;
  bool recompute = st->in_backward != 0;
  PyObject* mode = nullptr;
  unsigned long long t0 = 0;
  if (!r->loss) {
    bool ok = true;
    if (!recompute) {
      PyObject* stop = PyObject_GetAttr(r->roots, g_stop_at_known);
      ok = stop != nullptr;
      if (stop == reinterpret_cast<PyObject*>(st)) {  // a known root: the loop that looked again goes on with it
        PyObject* res = PyObject_CallMethodOneArg(r->roots, g_known_root_ran, stop);
        ok = res != nullptr;
        Py_XDECREF(res);
      }
      Py_XDECREF(stop);
      bool acting = false;
      mode = ok ? mode_of(r, st, &acting) : nullptr;
      ok = mode != nullptr;
      t0 = ticks();
      ok = ok && tell::forward_started(st, mode, t0, r->group, callable, acting);
    } else {
      mode = g_train;
      Py_INCREF(mode);
      t0 = ticks();
    }
    if (!ok) {
      report(r);
      t0 = 0;
    }
  } else {
    t0 = ticks();
  }
  PyObject* result = call_through(r, args, nargsf, kwnames);
  unsigned long long t1 = ticks();
  {
    HeldError held;  // what the call raised goes to the caller, unchanged
    --st->depth;
    bool ok = true;
    if (t0) {
      if (r->loss && !st->in_backward) ok = tell::loss(st, t0, t1);
      else if (r->loss) ok = tell::forward_ended(st, g_train, t0, t1, r->recompute);
      else if (recompute) ok = tell::forward_ended(st, mode, t0, t1, r->recompute);
      else ok = tell::forward_ended(st, mode, t0, t1, r->forward, r->group, callable);
    }
    if (!ok) report(r);
  }
  Py_XDECREF(mode);
  Py_DECREF(st);
  return result;
}

PyObject** fields(PyObject* o, int i) {
  Root* r = R(o);
  PyObject** all[] = {&r->ref, &r->inner, &r->call_impl, &r->local, &r->roots, &r->is_grad_enabled,
                      &r->is_training, &r->compiler, &r->fail, &r->forward, &r->recompute, &r->group};
  return i < int(sizeof(all) / sizeof(all[0])) ? all[i] : nullptr;
}

int root_traverse(PyObject* o, visitproc visit, void* arg) { return visit_fields(o, fields, visit, arg); }

int root_clear(PyObject* o) { return clear_fields(o, fields); }

void root_dealloc(PyObject* o) {
  PyObject_GC_UnTrack(o);
  root_clear(o);
  PyObject_GC_Del(o);
}

PyTypeObject RootType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Set-up time (a root adopted), so its arguments are named: keywords cost nothing per call.
PyObject* timed_root(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"ref", "inner", "call_impl", "local", "roots", "is_grad_enabled", "is_training",
                                "compiler", "fail", "loss", "phases", "group", nullptr};
  PyObject* a[12] = {};
  a[11] = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOOO!|O:timed_root", const_cast<char**>(names),
                                   &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7],
                                   &a[8], &a[9], &PyTuple_Type, &a[10], &a[11]))
    return nullptr;
  if (!PyWeakref_CheckRef(a[0]) || PyTuple_GET_SIZE(a[10]) != 2) {
    PyErr_SetString(PyExc_TypeError, "timed_root: ref is a weak reference, phases (forward, recompute)");
    return nullptr;
  }
  int loss = PyObject_IsTrue(a[9]);
  if (loss < 0) return nullptr;
  Root* r = PyObject_GC_New(Root, &RootType);
  if (!r) return nullptr;
  PyObject* values[] = {a[0], a[1] == Py_None ? nullptr : a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8],
                        PyTuple_GET_ITEM(a[10], 0), PyTuple_GET_ITEM(a[10], 1),
                        a[11] != Py_None ? a[11] : nullptr};
  for (int i = 0; PyObject** f = fields(reinterpret_cast<PyObject*>(r), i); ++i) {
    Py_XINCREF(values[i]);
    *f = values[i];
  }
  r->loss = loss;
  r->vectorcall = root_call;
  PyObject_GC_Track(r);
  return reinterpret_cast<PyObject*>(r);
}

// A copy of the model (deepcopy, pickle, torch.save) carries no root: the slot copies as
// None, torch's default, so it loads where stepscope is absent. nn.Module.__getstate__
// drops the slot itself; DistributedDataParallel's own __getstate__ copies it.
PyObject* root_reduce(PyObject*, PyObject*) {
  return Py_BuildValue("(O())", reinterpret_cast<PyObject*>(Py_TYPE(Py_None)));
}

PyMethodDef root_methods[] = {
    {"__reduce__", root_reduce, METH_NOARGS, "copies as None: a copy of the model is not timed"},
    {nullptr, nullptr, 0, nullptr}};

PyMethodDef methods[] = {
    {"timed_root", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(timed_root)),
     METH_VARARGS | METH_KEYWORDS,
     "timed_root(ref, inner, call_impl, local, roots, is_grad_enabled, is_training, compiler, fail, loss, "
     "phases=(forward, recompute), group=None): a root module's timed call (csrc/torch/roots.cc)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool add_roots(PyObject* module) {
  for (auto [slot, text] : {std::pair{&g_training, "training"},
                            {&g_stop_at_known, "stop_at_known"}, {&g_known_root_ran, "known_root_ran"},
                            {&g_train, "train"}, {&g_eval, "eval"}}) {
    *slot = PyUnicode_InternFromString(text);
    if (!*slot) return false;
  }
  RootType.tp_methods = root_methods;
  if (!ready_wrapper_type(&RootType, "stepscope.core._native.torch.TimedRoot", sizeof(Root), offsetof(Root, vectorcall),
                          root_traverse, root_clear, root_dealloc, "A root module's timed call (csrc/torch/roots.cc)."))
    return false;
  return PyModule_AddFunctions(module, methods) == 0;
}

}  // namespace stepscope
