// Method wrappers for context managers entered on every step (hooks.cc).
#pragma once

#include <Python.h>

namespace stepscope {

// Adds filtered_enter and guarded_exit to the module; false with a Python error set.
bool add_hooks(PyObject* module);

}  // namespace stepscope
