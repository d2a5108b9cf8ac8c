// A root module's timed call (roots.cc).
#pragma once

#include <Python.h>

namespace stepscope {

// Adds timed_root to the module; false with a Python error set.
bool add_roots(PyObject* module);

}  // namespace stepscope
