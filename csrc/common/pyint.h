// Python int -> C integer on the hot path. On CPython 3.11 PyLong_AsLongLong and
// PyLong_AsUnsignedLongLong convert any int wider than one digit (every clock
// tick) byte by byte through _PyLong_AsByteArray, ~300 instructions a call;
// PyLong_AsLongLongAndOverflow folds the digits in a few. Measured with
// callgrind (BENCHMARKS.md): ~3,500 instructions of each training step.
#pragma once
#include <Python.h>

namespace stepscope {

// A non-negative int (a tick, a count) as uint64; anything else as CPython converts it.
inline bool u64_of(PyObject* o, unsigned long long* out) {
  if (PyLong_Check(o)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (!overflow && v >= 0) {
      *out = (unsigned long long)v;
      return true;
    }
  }
  *out = PyLong_AsUnsignedLongLong(o);  // >= 2**63, negative (error), not an int (error)
  return !(*out == (unsigned long long)-1 && PyErr_Occurred());
}

inline bool i64_of(PyObject* o, long long* out) {
  if (PyLong_Check(o)) {
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (!overflow) return !(*out == -1 && PyErr_Occurred());
  }
  *out = PyLong_AsLongLong(o);  // raises the error CPython gives
  return !(*out == -1 && PyErr_Occurred());
}

}  // namespace stepscope
