// The per-event Python entry points (hot.cc): Span, annotate, phase, span,
// instant, counter, now, and the str -> id name cache they share.
#pragma once

#include <Python.h>

#include <cstdint>

namespace stepscope {
namespace bindings {

// Adds the Span type, the hot functions and PHASES (the phase names, interned
// first: ids 0..5) to the module; false with a Python error set.
bool add_hot(PyObject* module);
// The interned id of a str, or -1 with a Python error set.
int64_t intern_obj(PyObject* name);
// What annotate() decorates with (new references, taken over): (name, category,
// func) -> wrapper, and (func) -> wrapper.
void set_decorators(PyObject* decorate, PyObject* bare);

}  // namespace bindings
}  // namespace stepscope
