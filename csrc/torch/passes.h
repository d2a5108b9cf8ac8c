// DataLoader.__iter__ in C: a pass over a loader begins (passes.cc).
#pragma once

#include <Python.h>

namespace stepscope {

// Adds timed_iter to the module; false with a Python error set.
bool add_passes(PyObject* module);

}  // namespace stepscope
