// The torch part's own Python module, stepscope.core._native.torch (submodule.cc).
#pragma once

#include <Python.h>

namespace stepscope {

// Adds the submodule `torch` to the native module, holding the torch-only types and
// functions (loop state, hooks, roots, passes, optimizer hooks); false with a Python
// error set.
bool add_torch_submodule(PyObject* parent);

}  // namespace stepscope
