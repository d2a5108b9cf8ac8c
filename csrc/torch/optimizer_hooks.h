// An optimizer step's global pre and post hooks in C (optimizer_hooks.cc).
#pragma once

#include <Python.h>

namespace stepscope {

// Adds optimizer_hook to the module; false with a Python error set.
bool add_optimizer_hooks(PyObject* module);

}  // namespace stepscope
