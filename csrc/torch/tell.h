// How the native hooks (hooks.cc, roots.cc, loop.cc) report to the calling
// thread's StepTracker: one typed function per report. Where the tracker's type
// leaves the reports native (steps.h, native_reports), the call goes straight to
// them: no ticks boxed into ints, no method looked up. Those cost ~3,000 of the
// ~12,000 instructions a step the hooks added (callgrind, BENCHMARKS.md). Else
// (a subclass or a patch replacing a report) the tracker's method is called.
#pragma once

#include <Python.h>

#include <cstdint>

#include "torch/loop.h"

namespace stepscope {
namespace tell {

// Each: false with a Python error set. The state's tracker may be replaced
// during the report (its on_new_step callback); the call holds its own reference.
bool fetched(LoopState* st, unsigned long long t0, unsigned long long t1, PyObject* mode);
bool exhausted(LoopState* st, unsigned long long t0, unsigned long long t1);
// group: the root's group (parts of one forward the program called directly), or null;
// part: the root itself.
bool forward_started(LoopState* st, PyObject* mode, unsigned long long now, PyObject* group = nullptr,
                     PyObject* part = nullptr, bool acting = false);
// phase: a phase's interned id (an int object, the root's own): Forward or Recompute.
bool forward_ended(LoopState* st, PyObject* mode, unsigned long long t0, unsigned long long t1, PyObject* phase,
                   PyObject* group = nullptr, PyObject* part = nullptr);
bool loss(LoopState* st, unsigned long long t0, unsigned long long t1);
bool backward_started(LoopState* st, unsigned long long now, bool begins_step);
bool backward_ended(LoopState* st, unsigned long long t0, unsigned long long t1);
bool optimizer_used(LoopState* st);
bool optimizer_started(LoopState* st, PyObject* key, unsigned long long now);
bool optimizer_ended(LoopState* st, PyObject* key, unsigned long long t0, unsigned long long t1);
bool loop_started(LoopState* st);

// Interns the reports' method names; false with a Python error set.
bool init();

}  // namespace tell
}  // namespace stepscope
