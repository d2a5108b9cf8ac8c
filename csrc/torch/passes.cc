// A pass over a loader begins: DataLoader.__iter__, in C. It runs once an epoch,
// which is every few steps for a small dataset or a validation loop; its Python
// wrapper cost six Python frames a pass (BENCHMARKS.md, bench/overhead.py: a
// pass every 8 steps).
//
//   timed_iter(original, state, seen, on_new, on_workers, fail)
//
// __iter__(loader) calls original(loader); then, where the calling thread has no
// fetch or root forward open and no pass began since its last fetch, the pass's
// start is kept on its loop state (`state.s.iter_started`: the workers' start
// belongs to the first fetch), a loader not iterated before (no weak reference
// to it in the set `seen`) goes to on_new(loader) (None: one that cannot be
// weakly referenced), and the tracker hears loop_started(). A loader with
// workers goes to on_workers(loader). Failures go to fail(exc); what original
// returns or raises reaches the caller unchanged.
//
// Set on a class, it binds to instances as functions do; read from the class it
// is itself, with the original's name, docstring and signature.
#include "torch/passes.h"

#include <cstddef>

#include "common/clock.h"
#include "torch/loop.h"
#include "torch/tell.h"

namespace stepscope {
namespace {

struct Iter {
  PyObject_HEAD
  PyObject* original;
  PyObject* state;  // .s: the thread's loop state
  PyObject* seen;   // set of weak references to the loaders iterated before
  PyObject* on_new;
  PyObject* on_workers;
  PyObject* fail;
  vectorcallfunc vectorcall;
};

PyObject* g_num_workers;

Iter* I(PyObject* o) { return reinterpret_cast<Iter*>(o); }

// Whether `loader` is new to this integration (1), known (0); -1 with an error set.
int is_new(Iter* it, PyObject* loader, bool* weak) {
  PyObject* ref = PyWeakref_NewRef(loader, nullptr);
  *weak = ref != nullptr;
  if (!ref) {
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
    PyErr_Clear();  // not weakly referenceable: always new
    return 1;
  }
  int known = PySet_Contains(it->seen, ref);
  Py_DECREF(ref);
  return known < 0 ? -1 : !known;
}

bool pass_began(Iter* it, PyObject* loader, unsigned long long t0) {
  LoopState* st = loop_state_of(it->state);
  if (!st) return false;
  bool ok = true;
  if (st->iter_started == Py_None && !st->depth) {
    PyObject* began = PyLong_FromUnsignedLongLong(t0);
    ok = began != nullptr;
    if (ok) Py_SETREF(st->iter_started, began);
    bool weak = false;
    int fresh = ok ? is_new(it, loader, &weak) : -1;
    if (fresh == 1) {
      PyObject* r = PyObject_CallOneArg(it->on_new, weak ? loader : Py_None);
      ok = r != nullptr;
      Py_XDECREF(r);
    }
    ok = ok && fresh >= 0 && tell::loop_started(st);
  }
  Py_DECREF(st);
  return ok;
}

bool workers_configured(Iter* it, PyObject* loader) {
  PyObject* n = PyObject_GetAttr(loader, g_num_workers);
  int any = n ? PyObject_IsTrue(n) : -1;
  Py_XDECREF(n);
  if (any <= 0) {
    if (any < 0) PyErr_Clear();  // not a DataLoader's attributes: no workers to configure
    return true;
  }
  PyObject* r = PyObject_CallOneArg(it->on_workers, loader);
  Py_XDECREF(r);
  return r != nullptr;
}

PyObject* iter_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Iter* it = I(callable);
  unsigned long long t0 = ticks();
  PyObject* result = PyObject_Vectorcall(it->original, args, nargsf, kwnames);
  if (!result || PyVectorcall_NARGS(nargsf) < 1) return result;
  PyObject* loader = args[0];
  if (!pass_began(it, loader, t0)) hand_error_to(it->fail);
  if (!workers_configured(it, loader)) hand_error_to(it->fail);
  return result;
}

PyObject** fields(PyObject* o, int i) {
  Iter* it = I(o);
  PyObject** all[] = {&it->original, &it->state, &it->seen, &it->on_new, &it->on_workers, &it->fail};
  return i < int(sizeof(all) / sizeof(all[0])) ? all[i] : nullptr;
}

int iter_traverse(PyObject* o, visitproc visit, void* arg) { return visit_fields(o, fields, visit, arg); }

int iter_clear(PyObject* o) { return clear_fields(o, fields); }

void iter_dealloc(PyObject* o) {
  PyObject_GC_UnTrack(o);
  iter_clear(o);
  PyObject_GC_Del(o);
}

// Bound to an instance: a method; seen from the class: itself (a subclass's
// DataLoader.__iter__(self) is timed too).
PyObject* iter_get(PyObject* self, PyObject* obj, PyObject*) {
  if (!obj || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

// As functools.wraps would give: the original's __name__ and __qualname__, and its
// signature (through __wrapped__).
PyObject* iter_getattro(PyObject* self, PyObject* name) {
  PyObject* r = PyObject_GenericGetAttr(self, name);
  if (r || !PyErr_ExceptionMatches(PyExc_AttributeError)) return r;
  PyErr_Clear();
  return PyObject_GetAttr(I(self)->original, name);
}

PyObject* get_wrapped(PyObject* self, void*) {
  Py_INCREF(I(self)->original);
  return I(self)->original;
}

PyGetSetDef getset[] = {{"__wrapped__", get_wrapped, nullptr, "the original __iter__", nullptr},
                        {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject IterType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Set-up time (DataLoader.__iter__ patched), so its arguments are named.
PyObject* timed_iter(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"original", "state", "seen", "on_new", "on_workers", "fail", nullptr};
  PyObject* a[6];
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO:timed_iter", const_cast<char**>(names), &a[0], &a[1],
                                   &a[2], &a[3], &a[4], &a[5]))
    return nullptr;
  if (!PyAnySet_Check(a[2]) || !PyCallable_Check(a[0]) || !PyCallable_Check(a[3]) || !PyCallable_Check(a[4]) ||
      !PyCallable_Check(a[5])) {
    PyErr_SetString(PyExc_TypeError, "timed_iter(original, state, seen: set, on_new, on_workers, fail)");
    return nullptr;
  }
  Iter* it = PyObject_GC_New(Iter, &IterType);
  if (!it) return nullptr;
  for (int i = 0; PyObject** f = fields(reinterpret_cast<PyObject*>(it), i); ++i) {
    Py_INCREF(a[i]);
    *f = a[i];
  }
  it->vectorcall = iter_call;
  PyObject_GC_Track(it);
  return reinterpret_cast<PyObject*>(it);
}

PyMethodDef methods[] = {
    {"timed_iter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(timed_iter)),
     METH_VARARGS | METH_KEYWORDS,
     "timed_iter(original, state, seen, on_new, on_workers, fail): DataLoader.__iter__ that marks a pass's "
     "start on the thread's loop state (csrc/torch/passes.cc)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool add_passes(PyObject* module) {
  g_num_workers = PyUnicode_InternFromString("num_workers");
  if (!g_num_workers) return false;
  IterType.tp_descr_get = iter_get;
  IterType.tp_getattro = iter_getattro;
  IterType.tp_getset = getset;
  if (!ready_wrapper_type(&IterType, "stepscope.core._native.torch.TimedIter", sizeof(Iter), offsetof(Iter, vectorcall),
                          iter_traverse, iter_clear, iter_dealloc,
                          "DataLoader.__iter__, marking a pass's start (csrc/torch/passes.cc)."))
    return false;
  return PyModule_AddFunctions(module, methods) == 0;
}

}  // namespace stepscope
