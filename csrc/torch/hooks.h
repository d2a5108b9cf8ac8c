// torch's method wrappers: the Hook type (hooks.cc, hook_type.h), record_function's
// __enter__/__exit__ (record_function.cc), the engine call of backward (backward.cc).
#pragma once

#include <Python.h>

namespace stepscope {

// Adds filtered_enter, guarded_exit and timed_backward to the module; false with a Python error set.
bool add_hooks(PyObject* module);

}  // namespace stepscope
