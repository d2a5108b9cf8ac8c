// One thread's place in its training loop (loop.cc; integrations/torch/_loops.py
// keeps one per thread). A C struct so that the native wrappers on every step
// (hooks.cc) read and set it directly: through attribute names it cost them
// ~200 instructions an access (callgrind, BENCHMARKS.md). Python code reads the
// same fields as attributes (slot members, as fast as __slots__).
#pragma once

#include <Python.h>

#include "common/wrapper_type.h"

#include <atomic>
#include <cstdint>

namespace stepscope {

struct LoopState {
  PyObject_HEAD
  // Python-facing counters (int members): plain C longs, so that the native hooks
  // neither unbox nor box them on every step.
  long depth;         // root forwards (or a fetch) in progress: nested work is theirs
  long in_backward;   // a backward in progress (forwards inside are Recompute)
  long in_optimizer;  // optimizer steps in progress
  // Python-facing fields: lists and objects, never NULL once initialised.
  PyObject* stack;         // (t0, mode, phase, part) of open root forwards (discovery's)
  PyObject* forced_modes;  // a framework loop that knows its mode (Keras fit/evaluate/predict)
  PyObject* iter_started;  // tick: DataLoader.__iter__ began, no fetch since; None
  PyObject* setting_mode;  // inside Module.train(): its children's calls are its own
  PyObject* pending_root;  // a module whose first call is timed by the discovery post-hook
  PyObject* tracker;       // the thread's StepTracker
  PyObject* optimizer_key; // the outermost optimizer step in progress (its key); None
  // Native-only ticks (read-only from Python).
  unsigned long long optimizer_t0;  // the outermost optimizer step in progress began
  unsigned long long fetch_t0;      // the outermost fetch in progress began
  unsigned long long zero_grad_t0;  // an optimizer's zero_grad in progress began
  // torch's `Optimizer.step#` ranges open on this thread (hooks.cc), and a bit per
  // range level whose optimizer step the pre-hook began: that range's exit ends it.
  unsigned long long optimizer_ranges;
  unsigned long long ranges_began;
  // The innermost `Optimizer.step#` range was entered (before torch's own __enter__): a
  // step its pre-hook begins starts there, so that the Optimizer phase holds the whole
  // optimizer.step() call torch times, not only what runs between the hooks.
  unsigned long long optimizer_range_t0;
  // The record_function range entered last on this thread and its route (hooks.cc):
  // its __exit__, when no other range came between, skips reading its name again.
  // An address compared, never dereferenced; cleared at any exit.
  const void* range_entered;
  int range_route;
};

extern PyTypeObject LoopStateType;

inline bool is_loop_state(PyObject* o) { return Py_IS_TYPE(o, &LoopStateType); }

// The calling thread's loop state, `local.s` (a new reference; NULL with a
// Python error set when it is missing or not a LoopState). Cached per OS
// thread: a threading.local lookup costs ~500 instructions, and the native
// wrappers ask about ten times a step. Whoever replaces a thread's state (a
// forked child's reset) calls loop_states_changed() (Python: the same name).
//
// The hit is inline in each caller (about ten a step, each between torch's ops,
// its code cold): a call to a function elsewhere costs its cache lines too.
namespace loop_cache {
struct Cached {
  PyObject* local;
  PyObject* state;
  uint64_t epoch;
};
// plain TLS (no initialiser to run), initial-exec as writer.cc's tls_state: an
// offset from the thread pointer, not a __tls_get_addr call at every hook
extern __thread Cached t_cached __attribute__((tls_model("initial-exec")));
extern std::atomic<uint64_t> g_epoch;
LoopState* lookup(PyObject* local);  // the miss
}  // namespace loop_cache

inline LoopState* loop_state_of(PyObject* local) {
  loop_cache::Cached& c = loop_cache::t_cached;
  if (c.local == local && c.epoch == loop_cache::g_epoch.load(std::memory_order_acquire)) {
    Py_INCREF(c.state);
    return reinterpret_cast<LoopState*>(c.state);
  }
  return loop_cache::lookup(local);
}
void loop_states_changed();

// An optimizer step's pre and post hooks' bookkeeping, on the calling thread's
// loop state: the outermost step of nested ones (an optimizer stepping another)
// is reported, tracker.optimizer_started(key, t0) and optimizer_ended(key, t0,
// t1). False with a Python error set.
//
// Inside torch's `Optimizer.step#` range (every optimizer step since torch 2.0
// runs its hooks inside one), the step the pre-hook began is ended by that
// range's exit (optimizer_range_exited): no post-hook is needed, and one that
// runs anyway (the Python hooks) passes. `in_range` (optional) tells whether
// such a range was open: where none was, only a post-hook can end the step.
// The step then runs from the range's entry (its tick `t0`, taken before torch
// enters it) to the end of its exit: it encloses torch's range, whose own cost
// (tens of microseconds a step on a small VM) is the optimizer call's, not Other.
bool optimizer_began(PyObject* local, PyObject* key, bool* in_range = nullptr);
bool optimizer_done(PyObject* local, PyObject* key);
void optimizer_range_entered(LoopState* st, unsigned long long t0);
bool optimizer_range_exited(LoopState* st, unsigned long long t1);

// Whether torch.export traces (`compiler._is_compiling_flag`): 1, 0, or -1 with
// a Python error set. Timing is off then. Read five times a step: a module's flag
// straight from its dict, inline (~60 instructions where the attribute protocol
// takes ~300); anything else through the attribute.
namespace export_flag {
extern PyObject* g_name;
int read(PyObject* compiler);
}  // namespace export_flag

inline int exporting(PyObject* compiler) {
  if (PyModule_CheckExact(compiler)) {
    PyObject* flag = PyDict_GetItemWithError(PyModule_GetDict(compiler), export_flag::g_name);  // borrowed
    if (flag == Py_False) return 0;
  }
  return export_flag::read(compiler);
}

// Adds the LoopState type, loop_state, loop_states_changed, optimizer_began and
// optimizer_done to the module; false with a Python error set.
bool add_loop_state(PyObject* module);

}  // namespace stepscope
