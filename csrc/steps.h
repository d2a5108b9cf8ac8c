// The step tracker (steps.cc): from phase callbacks to contiguous steps.
#pragma once

#include <Python.h>

#include <cstdint>

namespace stepscope {

// Interns a Python str (module.cc's cache); -1 with a Python error set.
int64_t intern_pyname(PyObject* name);

// Adds the StepTracker type to the module; false with a Python error set.
bool add_step_tracker(PyObject* module);

}  // namespace stepscope
