// Method wrappers for context managers a framework enters on every step of a
// training loop (torch's record_function: optimizer step, zero_grad, each
// DataLoader fetch). Written in C because a Python wrapper frame costs about a
// microsecond there, three times a step on each side (BENCHMARKS.md,
// bench/overhead.py).
//
//   filtered_enter(original, record, prefixes, fail, loop=None): __enter__(self, ...)
//     calls original, then record(self.name, id(self)) unless the name is a str
//     starting with one of `prefixes` (the framework's own ranges).
//   guarded_exit(original, record, local, fail, loop=None): __exit__(self, ...) calls
//     record(id(self)) when `local.stack` is non-empty, then original.
//
// `loop` = (state, fetches, zero_grads, category, name) lets the framework's own
// ranges report the loop's phases, so that no Python wrapper runs for them:
// `state.s` is the calling thread's loop state (integrations/torch/_loops.py:
// its depth, iter_started, fetch_t0, zero_grad_t0 and tracker); a range whose
// name starts with one of `fetches` is one fetch of the loop (the outermost one
// reports tracker.fetched(t0, t1, None), or tracker.exhausted(t0, t1) when it
// ends in StopIteration; whatever runs inside it is nested in it: depth); one
// of `zero_grads` is recorded as the span (category, name) and reported as
// tracker.optimizer_used().
//
// Set on a class, both bind to instances as functions do; read from the class
// itself they are `original` (TorchScript compiles a class from its functions'
// source, and finds them through the class). A failure of `record` or of the
// loop's reports goes to fail(exc) and never to the caller; whatever `original`
// raises, or returns, reaches the caller unchanged.
#include "hooks.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "recorder.h"

namespace stepscope {
namespace {

struct Hook {
  PyObject_HEAD
  PyObject* original;
  PyObject* record;
  PyObject* prefixes;  // filtered_enter: tuple of str
  PyObject* local;     // guarded_exit: holds .stack
  PyObject* fail;
  PyObject* state;       // loop: .s is the thread's loop state; null: no loop routes
  PyObject* fetches;     // loop: tuples of str
  PyObject* zero_grads;
  uint8_t category;
  uint32_t span_name;
  PyObject* compiler;  // timed_backward: its _is_compiling_flag (export) turns timing off
  vectorcallfunc vectorcall;
};

enum Route { kUser, kPassed, kFetch, kZeroGrad };

PyObject *g_name, *g_stack, *g_s, *g_depth, *g_iter_started, *g_fetch_t0, *g_zero_grad_t0, *g_tracker,
    *g_fetched, *g_exhausted, *g_optimizer_used, *g_in_backward, *g_in_optimizer, *g_backward_started,
    *g_backward_ended, *g_is_compiling_flag;

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

bool starts_with_any(PyObject* name, PyObject* prefixes) {
  if (!prefixes) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); ++i) {
    Py_ssize_t r = PyUnicode_Tailmatch(name, PyTuple_GET_ITEM(prefixes, i), 0, PY_SSIZE_T_MAX, -1);
    if (r == 1) return true;
    if (r < 0) PyErr_Clear();
  }
  return false;
}

// Whose range `self` is, by its name; -1 (a failure, reported) when it has none.
int route_of(Hook* h, PyObject* self, PyObject** name) {
  *name = PyObject_GetAttr(self, g_name);
  if (!*name) {
    report(h);
    return -1;
  }
  if (!PyUnicode_CheckExact(*name)) return kUser;
  if (h->state && starts_with_any(*name, h->fetches)) return kFetch;
  if (h->state && starts_with_any(*name, h->zero_grads)) return kZeroGrad;
  return starts_with_any(*name, h->prefixes) ? kPassed : kUser;
}

// --- the loop's own ranges ------------------------------------------------------
// Each returns false with a Python error set; the caller reports it.

// The loop state's counters and ticks are ints (None reads as 0; ticks fit in 63 bits).
bool get_int(PyObject* o, PyObject* attr, long long* out) {
  PyObject* v = PyObject_GetAttr(o, attr);
  if (!v) return false;
  *out = v == Py_None ? 0 : PyLong_AsLongLong(v);
  Py_DECREF(v);
  return !(*out == -1 && PyErr_Occurred());
}

bool set_int(PyObject* o, PyObject* attr, long long value) {
  PyObject* v = PyLong_FromLongLong(value);
  int r = v ? PyObject_SetAttr(o, attr, v) : -1;
  Py_XDECREF(v);
  return r == 0;
}

// Calls tracker.<method>(args...) through the class: a subclass (or a test) may replace it.
bool report_to_tracker(PyObject* st, PyObject* method, PyObject* const* args, size_t n) {
  PyObject* tracker = PyObject_GetAttr(st, g_tracker);
  if (!tracker) return false;
  PyObject* stack[4] = {tracker, n > 0 ? args[0] : nullptr, n > 1 ? args[1] : nullptr, n > 2 ? args[2] : nullptr};
  PyObject* r = PyObject_VectorcallMethod(method, stack, (n + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  Py_DECREF(tracker);
  Py_XDECREF(r);
  return r != nullptr;
}

bool report_times(PyObject* st, PyObject* method, unsigned long long a, unsigned long long b, PyObject* c) {
  PyObject* x = PyLong_FromUnsignedLongLong(a);
  PyObject* y = PyLong_FromUnsignedLongLong(b);
  PyObject* args[3] = {x, y, c};
  bool ok = x && y && report_to_tracker(st, method, args, c ? 3 : 2);
  Py_XDECREF(x);
  Py_XDECREF(y);
  return ok;
}

bool fetch_entered(Hook* h, unsigned long long t0) {
  PyObject* st = PyObject_GetAttr(h->state, g_s);
  if (!st) return false;
  long long depth, began;
  // modules run by the dataset or collate are part of the fetch
  bool ok = get_int(st, g_depth, &depth) && set_int(st, g_depth, depth + 1);
  if (ok && depth == 0) {
    ok = get_int(st, g_iter_started, &began);  // DataLoader.__iter__ (worker start) belongs to the first fetch
    if (ok && began) {
      t0 = std::min<unsigned long long>(t0, began);
      ok = PyObject_SetAttr(st, g_iter_started, Py_None) == 0;
    }
    ok = ok && set_int(st, g_fetch_t0, t0);
  }
  Py_DECREF(st);
  return ok;
}

bool fetch_exited(Hook* h, PyObject* exc_type, unsigned long long t1) {
  PyObject* st = PyObject_GetAttr(h->state, g_s);
  if (!st) return false;
  long long depth, t0 = 0;
  bool ok = get_int(st, g_depth, &depth);
  if (ok && depth > 0) {  // 0: a forked child's fresh state, no fetch open in it
    ok = set_int(st, g_depth, depth - 1);
    if (ok && depth == 1) ok = get_int(st, g_fetch_t0, &t0);
  }
  if (ok && t0) {
    bool stopped = exc_type && exc_type != Py_None && PyType_Check(exc_type) &&
                   PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(exc_type),
                                    reinterpret_cast<PyTypeObject*>(PyExc_StopIteration));
    if (stopped) ok = report_times(st, g_exhausted, t0, t1, nullptr);
    else if (!exc_type || exc_type == Py_None) ok = report_times(st, g_fetched, t0, t1, Py_None);  // mode: its work's
  }
  Py_DECREF(st);
  return ok;
}

bool zero_grad_entered(Hook* h, unsigned long long t0) {
  PyObject* st = PyObject_GetAttr(h->state, g_s);
  bool ok = st && set_int(st, g_zero_grad_t0, t0);
  Py_XDECREF(st);
  return ok;
}

bool zero_grad_exited(Hook* h, unsigned long long t1) {
  long long t0 = 0;
  PyObject* st = PyObject_GetAttr(h->state, g_s);
  if (!st) return false;
  bool ok = get_int(st, g_zero_grad_t0, &t0);
  if (ok && t0) {
    record_span(h->category, h->span_name, t0, t1);
    ok = set_int(st, g_zero_grad_t0, 0) && report_to_tracker(st, g_optimizer_used, nullptr, 0);
  }
  Py_DECREF(st);
  return ok;
}

// --- the wrappers ----------------------------------------------------------------

PyObject* enter_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Hook* h = reinterpret_cast<Hook*>(callable);
  if (PyVectorcall_NARGS(nargsf) < 1) return PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  PyObject* self = args[0];
  PyObject* name;
  unsigned long long t0 = ticks();
  int route = route_of(h, self, &name);
  PyObject* result = PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  if (!result || route < 0) {
    Py_XDECREF(name);
    return result;
  }
  bool ok = true;
  if (route == kFetch) {
    ok = fetch_entered(h, t0);
  } else if (route == kZeroGrad) {
    ok = zero_grad_entered(h, t0);
  } else if (route == kUser) {
    PyObject* key = PyLong_FromVoidPtr(self);
    PyObject* r = key ? PyObject_CallFunctionObjArgs(h->record, name, key, nullptr) : nullptr;
    Py_XDECREF(key);
    Py_XDECREF(r);
    ok = r != nullptr;
  }
  if (!ok) report(h);
  Py_DECREF(name);
  return result;
}

PyObject* exit_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Hook* h = reinterpret_cast<Hook*>(callable);
  size_t n = PyVectorcall_NARGS(nargsf);
  if (n >= 1) {
    PyObject* name;
    int route = h->state ? route_of(h, args[0], &name) : kUser;
    if (h->state && route >= 0) Py_DECREF(name);
    if (route == kFetch || route == kZeroGrad) {
      // the loop's span ends after torch's range (a profiler's op for it nests inside)
      PyObject* result = PyObject_Vectorcall(h->original, args, nargsf, kwnames);
      unsigned long long t1 = ticks();
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);
      bool ok = route == kFetch ? fetch_exited(h, n >= 2 ? args[1] : nullptr, t1) : zero_grad_exited(h, t1);
      if (!ok) report(h);
      PyErr_Restore(type, value, tb);
      return result;
    }
    bool ok = true;
    if (route == kUser) {
      PyObject* stack = PyObject_GetAttr(h->local, g_stack);
      int open = stack ? PyObject_IsTrue(stack) : 0;
      Py_XDECREF(stack);
      if (!stack || open < 0) PyErr_Clear();  // no range opened on this thread: torch's own
      if (open == 1) {
        PyObject* key = PyLong_FromVoidPtr(args[0]);
        PyObject* r = key ? PyObject_CallOneArg(h->record, key) : nullptr;
        Py_XDECREF(key);
        Py_XDECREF(r);
        ok = r != nullptr;
      }
    }
    if (!ok) report(h);
  }
  return PyObject_Vectorcall(h->original, args, nargsf, kwnames);
}

// --- backward -----------------------------------------------------------------------
// The engine call of every backward (torch.autograd.backward and grad end in
// it), timed; nested calls count once; a backward inside an optimizer step
// (LBFGS's closure) begins no step. Dynamo never runs it: it stops its graph at
// the backward before.

PyObject* backward_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Hook* h = reinterpret_cast<Hook*>(callable);
  PyObject* st = PyObject_GetAttr(h->state, g_s);
  long long nested = 0, depth = 0, in_optimizer = 0;
  bool ok = st && get_int(st, g_in_backward, &nested);
  if (ok && !nested) {
    PyObject* flag = PyObject_GetAttr(h->compiler, g_is_compiling_flag);  // torch.export runs
    int compiling = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(flag);
    ok = compiling == 0;
  }
  if (!ok || nested) {
    if (PyErr_Occurred()) report(h);
    Py_XDECREF(st);
    return PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  }
  unsigned long long t0 = ticks();
  if (get_int(st, g_depth, &depth) && get_int(st, g_in_optimizer, &in_optimizer) && !depth) {
    PyObject* now = PyLong_FromUnsignedLongLong(t0);
    PyObject* a[2] = {now, in_optimizer ? Py_False : Py_True};  // inside an optimizer step: no new step
    if (now) report_to_tracker(st, g_backward_started, a, 2);
    Py_XDECREF(now);
  }
  if (PyErr_Occurred()) report(h);
  bool counted = set_int(st, g_in_backward, 1);
  if (!counted) report(h);
  PyObject* result = PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);  // what the backward raised goes to the caller, unchanged
  if (counted && !set_int(st, g_in_backward, 0)) report(h);
  if (!report_times(st, g_backward_ended, t0, ticks(), nullptr)) report(h);
  PyErr_Restore(type, value, tb);
  Py_DECREF(st);
  return result;
}

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
  Py_VISIT(h->compiler);
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
  Py_CLEAR(h->compiler);
  return 0;
}

void hook_dealloc(PyObject* o) {
  PyObject_GC_UnTrack(o);
  hook_clear(o);
  PyObject_GC_Del(o);
}

PyTypeObject HookType = {PyVarObject_HEAD_INIT(nullptr, 0)};

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
  PyObject *state = nullptr, *fetches = nullptr, *zero_grads = nullptr;
  unsigned int category = 0, span_name = 0;
  if (loop && loop != Py_None &&
      !(PyTuple_Check(loop) &&
        PyArg_ParseTuple(loop, "OO!O!II:loop", &state, &PyTuple_Type, &fetches, &PyTuple_Type, &zero_grads,
                         &category, &span_name) &&
        str_tuple(fetches) && str_tuple(zero_grads) && category < 256)) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_TypeError, "loop is (state, fetches: tuple of str, zero_grads: tuple of str, "
                                       "category, name)");
    return nullptr;
  }
  Hook* h = PyObject_GC_New(Hook, &HookType);
  if (!h) return nullptr;
  for (auto [slot, value] : {std::pair{&h->original, original}, {&h->record, record}, {&h->prefixes, prefixes},
                             {&h->local, local}, {&h->fail, fail}, {&h->state, state}, {&h->fetches, fetches},
                             {&h->zero_grads, zero_grads}}) {
    Py_XINCREF(value);
    *slot = value;
  }
  h->category = uint8_t(category);
  h->span_name = span_name;
  h->compiler = nullptr;
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
  if (n < 4 || n > 5 || !str_tuple(a[2])) {
    PyErr_SetString(PyExc_TypeError, "filtered_enter(original, record, prefixes: tuple of str, fail, loop=None)");
    return nullptr;
  }
  return make(a[0], a[1], a[2], nullptr, a[3], n > 4 ? a[4] : nullptr, enter_call);
}

PyObject* guarded_exit(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n < 4 || n > 5) {
    PyErr_SetString(PyExc_TypeError, "guarded_exit(original, record, local, fail, loop=None)");
    return nullptr;
  }
  return make(a[0], a[1], nullptr, a[2], a[3], n > 4 ? a[4] : nullptr, exit_call);
}

PyObject* timed_backward(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 4) {
    PyErr_SetString(PyExc_TypeError, "timed_backward(original, state, compiler, fail)");
    return nullptr;
  }
  PyObject* h = make(a[0], a[3], nullptr, nullptr, a[3], nullptr, backward_call);
  if (h) {
    Hook* hook = reinterpret_cast<Hook*>(h);
    Py_INCREF(a[1]);
    hook->state = a[1];
    Py_INCREF(a[2]);
    hook->compiler = a[2];
  }
  return h;
}

#define FAST(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(f)), METH_FASTCALL
PyMethodDef functions[] = {
    {"filtered_enter", FAST(filtered_enter),
     "filtered_enter(original, record, prefixes, fail, loop=None): an __enter__ that calls record(self.name, "
     "id(self)) after original, unless the name starts with one of prefixes; loop: see csrc/hooks.cc"},
    {"guarded_exit", FAST(guarded_exit),
     "guarded_exit(original, record, local, fail, loop=None): an __exit__ that calls record(id(self)) when "
     "local.stack is non-empty, then original; loop: see csrc/hooks.cc"},
    {"timed_backward", FAST(timed_backward),
     "timed_backward(original, state, compiler, fail): the engine call of every backward, timed for the "
     "thread's tracker (state.s)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool add_hooks(PyObject* module) {
  for (auto [slot, text] : {std::pair{&g_name, "name"}, {&g_stack, "stack"}, {&g_s, "s"}, {&g_depth, "depth"},
                            {&g_iter_started, "iter_started"}, {&g_fetch_t0, "fetch_t0"},
                            {&g_zero_grad_t0, "zero_grad_t0"}, {&g_tracker, "tracker"}, {&g_fetched, "fetched"},
                            {&g_exhausted, "exhausted"}, {&g_optimizer_used, "optimizer_used"},
                            {&g_in_backward, "in_backward"}, {&g_in_optimizer, "in_optimizer"},
                            {&g_backward_started, "backward_started"}, {&g_backward_ended, "backward_ended"},
                            {&g_is_compiling_flag, "_is_compiling_flag"}}) {
    *slot = PyUnicode_InternFromString(text);
    if (!*slot) return false;
  }
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
