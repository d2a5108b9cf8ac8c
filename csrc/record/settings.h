// _native.configure(): the native core's settings, handed over by core/config.py (settings.cc).
#pragma once

#include <Python.h>

namespace stepscope {

// Adds configure() to the module; false with a Python error set.
bool add_settings(PyObject* module);

}  // namespace stepscope
