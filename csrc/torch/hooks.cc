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
// `loop` = (state, fetches, zero_grads, category, name[, optimizer_steps]) lets the framework's own
// ranges report the loop's phases, so that no Python wrapper runs for them:
// `state.s` is the calling thread's LoopState (loop.h; found through the
// per-thread cache, its fields read in C: depth, iter_started, fetch_t0,
// zero_grad_t0, the tracker); a range whose
// name starts with one of `fetches` is one fetch of the loop (the outermost one
// reports tracker.fetched(t0, t1, None), or tracker.exhausted(t0, t1) when it
// ends in StopIteration; whatever runs inside it is nested in it: depth); one
// of `zero_grads` is recorded as the span (category, name) and reported as
// tracker.optimizer_used(); one of `optimizer_steps` (optional) is torch's range
// around an optimizer step, whose exit ends the step its pre-hook began (loop.h).
//
// Set on a class, both bind to instances as functions do; read from the class
// itself they are `original` (TorchScript compiles a class from its functions'
// source, and finds them through the class). A failure of `record` or of the
// loop's reports goes to fail(exc) and never to the caller; whatever `original`
// raises, or returns, reaches the caller unchanged.
#include "torch/hooks.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "torch/loop.h"
#include "common/pyint.h"
#include "record/recorder.h"
#include "steps/steps.h"
#include "torch/tell.h"

namespace stepscope {
namespace {

constexpr int kSeen = 4;

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
  PyObject* optimizer_steps;  // loop: tuple of str (optional)
  uint8_t category;
  uint32_t span_name;
  PyObject* compiler;  // timed_backward: its _is_compiling_flag (export) turns timing off
  vectorcallfunc vectorcall;
  // Routes of the last names seen: a framework's range names come back on every
  // step (the same string, or an equal one: the prefix tests are done once).
  PyObject* seen_names[kSeen];
  int8_t seen_routes[kSeen];
  uint8_t seen_next;
};

enum Route { kUser, kPassed, kFetch, kZeroGrad, kOptimizerStep };

PyObject *g_name, *g_stack;

// record(...) failed: hand the exception to fail(exc), never to the caller.
void report(Hook* h) { hand_error_to(h->fail); }

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
  for (int i = 0; i < kSeen; ++i) {
    if (h->seen_names[i] == *name) return h->seen_routes[i];  // held: the same string
  }
  // An equal string made anew (the optimizer step's name is formatted on every call):
  // its characters compared (hashing them costs more, and a new string's hash is not cached)
  for (int i = 0; i < kSeen; ++i) {
    PyObject* seen = h->seen_names[i];
    if (seen && PyUnicode_GET_LENGTH(seen) == PyUnicode_GET_LENGTH(*name) && PyUnicode_Compare(seen, *name) == 0) {
      // keep the newest: the same range's __exit__ then finds it by identity
      Py_INCREF(*name);
      Py_SETREF(h->seen_names[i], *name);
      return h->seen_routes[i];
    }
  }
  int route = kUser;
  if (h->state && starts_with_any(*name, h->fetches)) {
    route = kFetch;
  } else if (h->state && starts_with_any(*name, h->zero_grads)) {
    route = kZeroGrad;
  } else if (h->state && starts_with_any(*name, h->optimizer_steps)) {
    route = kOptimizerStep;
  } else if (starts_with_any(*name, h->prefixes)) {
    route = kPassed;
  }
  int slot = h->seen_next++ % kSeen;
  Py_INCREF(*name);
  Py_XSETREF(h->seen_names[slot], *name);
  h->seen_routes[slot] = int8_t(route);
  return route;
}

// --- the loop's own ranges ------------------------------------------------------
// Each returns false with a Python error set; the caller reports it.

// The calling thread's loop state (a new reference): `state.s`, a LoopState (loop.h).
LoopState* state_of(Hook* h) { return loop_state_of(h->state); }

bool fetch_entered(LoopState* st, unsigned long long t0) {
  // modules run by the dataset or collate are part of the fetch
  bool ok = true;
  if (st->depth++ == 0) {
    unsigned long long began = 0;  // DataLoader.__iter__ (worker start) belongs to the first fetch
    if (st->iter_started && st->iter_started != Py_None) {
      ok = u64_of(st->iter_started, &began);
      Py_INCREF(Py_None);
      Py_XSETREF(st->iter_started, Py_None);
    }
    st->fetch_t0 = began ? std::min(t0, began) : t0;
  }
  return ok;
}

bool fetch_exited(LoopState* st, PyObject* exc_type, unsigned long long t1) {
  unsigned long long t0 = 0;
  bool ok = true;
  if (st->depth > 0 && --st->depth == 0) {  // 0 before: a forked child's fresh state, no fetch open
    t0 = st->fetch_t0;
    st->fetch_t0 = 0;
  }
  if (t0) {
    bool stopped = exc_type && exc_type != Py_None && PyType_Check(exc_type) &&
                   PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(exc_type),
                                    reinterpret_cast<PyTypeObject*>(PyExc_StopIteration));
    if (stopped) ok = tell::exhausted(st, t0, t1);
    else if (!exc_type || exc_type == Py_None) ok = tell::fetched(st, t0, t1, Py_None);  // mode: its work's
  }
  return ok;
}

bool zero_grad_entered(LoopState* st, unsigned long long t0) {
  st->zero_grad_t0 = t0;
  return true;
}

bool zero_grad_exited(Hook* h, LoopState* st, unsigned long long t1) {
  unsigned long long t0 = st->zero_grad_t0;
  bool ok = true;
  if (t0) {
    record_span(h->category, h->span_name, t0, t1);
    st->zero_grad_t0 = 0;
    ok = tell::optimizer_used(st);
  }
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
  if (h->state) {
    LoopState* st = state_of(h);
    ok = st != nullptr;
    if (st) {
      st->range_entered = self;  // its __exit__ knows the route without reading the name again
      st->range_route = route;
      if (route == kFetch) ok = fetch_entered(st, t0);
      else if (route == kZeroGrad) ok = zero_grad_entered(st, t0);
      // torch's range around an optimizer step and its hooks: its exit ends the step the
      // pre-hook began (loop.h), so that no post-hook runs on every step
      else if (route == kOptimizerStep) optimizer_range_entered(st);
      Py_DECREF(st);
    }
  }
  if (ok && route == kUser) {
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
    int route = kUser;
    LoopState* st = nullptr;
    if (h->state) {
      st = state_of(h);
      if (!st) {
        report(h);
        return PyObject_Vectorcall(h->original, args, nargsf, kwnames);
      }
      if (st->range_entered == args[0]) {  // the range entered last (ranges nest): its route
        route = st->range_route;
      } else {
        PyObject* name;
        route = route_of(h, args[0], &name);
        if (route >= 0) Py_DECREF(name);
      }
      st->range_entered = nullptr;
    }
    if (st && route == kOptimizerStep) {
      // the Optimizer phase began inside torch's range (at the pre-hook): it ends inside
      // it too, so that a profiler's op for the range encloses it
      if (!optimizer_range_exited(st, ticks())) report(h);
      Py_DECREF(st);
      return PyObject_Vectorcall(h->original, args, nargsf, kwnames);
    }
    if (st && (route == kFetch || route == kZeroGrad)) {
      // the loop's span ends after torch's range (a profiler's op for it nests inside)
      PyObject* result = PyObject_Vectorcall(h->original, args, nargsf, kwnames);
      unsigned long long t1 = ticks();
      {
        HeldError held;
        bool ok = route == kFetch ? fetch_exited(st, n >= 2 ? args[1] : nullptr, t1) : zero_grad_exited(h, st, t1);
        if (!ok) report(h);
      }
      Py_DECREF(st);
      return result;
    }
    Py_XDECREF(st);
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

// Bound to an instance: a method of the hook; seen from the class: the original.
PyObject* hook_get(PyObject* self, PyObject* obj, PyObject*) {
  if (!obj || obj == Py_None) {
    PyObject* original = reinterpret_cast<Hook*>(self)->original;
    Py_INCREF(original);
    return original;
  }
  return PyMethod_New(self, obj);
}

// Set-up time (record_function and the engine call patched), so the arguments are named.
PyObject* filtered_enter(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"original", "record", "prefixes", "fail", "loop", nullptr};
  PyObject *original, *record, *prefixes, *fail, *loop = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|O:filtered_enter", const_cast<char**>(names), &original,
                                   &record, &prefixes, &fail, &loop))
    return nullptr;
  if (!str_tuple(prefixes)) {
    PyErr_SetString(PyExc_TypeError, "filtered_enter(original, record, prefixes: tuple of str, fail, loop=None)");
    return nullptr;
  }
  return make(original, record, prefixes, nullptr, fail, loop, enter_call);
}

PyObject* guarded_exit(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"original", "record", "local", "fail", "loop", nullptr};
  PyObject *original, *record, *local, *fail, *loop = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|O:guarded_exit", const_cast<char**>(names), &original,
                                   &record, &local, &fail, &loop))
    return nullptr;
  return make(original, record, nullptr, local, fail, loop, exit_call);
}

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

#define KEYWORDS(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(f)), METH_VARARGS | METH_KEYWORDS
PyMethodDef functions[] = {
    {"filtered_enter", KEYWORDS(filtered_enter),
     "filtered_enter(original, record, prefixes, fail, loop=None): an __enter__ that calls record(self.name, "
     "id(self)) after original, unless the name starts with one of prefixes; loop: see csrc/torch/hooks.cc"},
    {"guarded_exit", KEYWORDS(guarded_exit),
     "guarded_exit(original, record, local, fail, loop=None): an __exit__ that calls record(id(self)) when "
     "local.stack is non-empty, then original; loop: see csrc/torch/hooks.cc"},
    {"timed_backward", KEYWORDS(timed_backward),
     "timed_backward(original, state, compiler, fail): the engine call of every backward, timed for the "
     "thread's tracker (state.s)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool add_hooks(PyObject* module) {
  for (auto [slot, text] : {std::pair{&g_name, "name"}, {&g_stack, "stack"}}) {
    *slot = PyUnicode_InternFromString(text);
    if (!*slot) return false;
  }
  HookType.tp_descr_get = hook_get;
  if (!ready_wrapper_type(&HookType, "stepscope.core._native.torch.Hook", sizeof(Hook), offsetof(Hook, vectorcall),
                          hook_traverse, hook_clear, hook_dealloc, "A method wrapper (filtered_enter, guarded_exit)."))
    return false;
  return PyModule_AddFunctions(module, functions) == 0;
}

}  // namespace stepscope
