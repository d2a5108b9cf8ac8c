// record_function's method wrappers: context managers a framework enters on every step of a
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
#include <algorithm>
#include <cstddef>

#include "common/pyint.h"
#include "record/recorder.h"
#include "torch/hook_type.h"
#include "torch/tell.h"

namespace stepscope {
namespace hook {
namespace {

PyObject *g_name, *g_stack;

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
      // torch's range around an optimizer step and its hooks: the step the pre-hook
      // begins starts at its entry (t0) and its exit ends it (loop.h), so that no
      // post-hook runs on every step
      else if (route == kOptimizerStep) optimizer_range_entered(st, t0);
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
    if (st && (route == kFetch || route == kZeroGrad || route == kOptimizerStep)) {
      // the loop's span ends after torch's range (a profiler's op for it nests inside);
      // the Optimizer phase, begun at the range's entry (before torch's), likewise
      PyObject* result = PyObject_Vectorcall(h->original, args, nargsf, kwnames);
      unsigned long long t1 = ticks();
      {
        HeldError held;
        bool ok = route == kFetch         ? fetch_exited(st, n >= 2 ? args[1] : nullptr, t1)
                  : route == kZeroGrad    ? zero_grad_exited(h, st, t1)
                                          : optimizer_range_exited(st, t1);
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

}  // namespace

bool record_function_ready() {
  g_name = PyUnicode_InternFromString("name");
  g_stack = PyUnicode_InternFromString("stack");
  return g_name && g_stack;
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

}  // namespace hook
}  // namespace stepscope
