// A call wrapper that leaves no frame in tracebacks (around.cc).
#pragma once

#include <Python.h>

namespace stepscope {

// Adds around() to the module; false with a Python error set.
bool add_around(PyObject* module);

}  // namespace stepscope
