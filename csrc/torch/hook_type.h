// The Hook object that torch's method wrappers share (hooks.cc makes them): the
// record_function wrappers (record_function.cc) and the engine call of backward
// (backward.cc). Internal to csrc/torch/.
#pragma once

#include <Python.h>

#include <cstdint>

#include "common/wrapper_type.h"
#include "torch/loop.h"

namespace stepscope {
namespace hook {

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

// record(...) failed: hand the exception to fail(exc), never to the caller.
inline void report(Hook* h) { hand_error_to(h->fail); }

// The calling thread's loop state (a new reference): `state.s`, a LoopState (loop.h).
inline LoopState* state_of(Hook* h) { return loop_state_of(h->state); }

// Whether o is a tuple of str.
bool str_tuple(PyObject* o);
// A new Hook calling `call` (the arguments checked; loop: see record_function.cc).
PyObject* make(PyObject* original, PyObject* record, PyObject* prefixes, PyObject* local, PyObject* fail,
               PyObject* loop, vectorcallfunc call);

// The constructors (set-up time, named arguments), and the names they read.
bool record_function_ready();  // interns the attribute names read (record_function.cc)
PyObject* filtered_enter(PyObject*, PyObject* args, PyObject* kwargs);  // record_function.cc
PyObject* guarded_exit(PyObject*, PyObject* args, PyObject* kwargs);    // record_function.cc
PyObject* timed_backward(PyObject*, PyObject* args, PyObject* kwargs);  // backward.cc

}  // namespace hook
}  // namespace stepscope
