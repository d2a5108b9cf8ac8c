// _native.configure(): the values of the STEPSCOPE_* variables the native core uses.
// The native code reads no environment: core/config.py parses and validates every
// variable, and hands these over right after the import and at each session's start.
#include <Python.h>

#include <cstring>

#include "record/pysampler.h"
#include "record/recorder.h"
#include "record/sampler.h"
#include "record/settings.h"

namespace stepscope {
namespace {

// configure(clock=None, pysample_method=None, pysample_rt=None, proc_root=None):
// None leaves a setting as it is. clock: "auto" or "monotonic" (the tick source is
// chosen again only while no trace is open); pysample_method: "auto" or "gil";
// pysample_rt: bool; proc_root: a folder standing in for /proc ("": /proc).
PyObject* py_configure(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kwlist[] = {"clock", "pysample_method", "pysample_rt", "proc_root", nullptr};
  const char *clock = nullptr, *method = nullptr, *proc_root = nullptr;
  PyObject* rt = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|zzOz:configure", const_cast<char**>(kwlist), &clock, &method,
                                   &rt, &proc_root))
    return nullptr;
  const bool clock_ok = !clock || !strcmp(clock, "auto") || !strcmp(clock, "monotonic");
  const bool method_ok = !method || !strcmp(method, "auto") || !strcmp(method, "gil");
  if (!clock_ok || !method_ok) {
    PyErr_SetString(PyExc_ValueError, clock_ok ? "pysample_method: 'auto' or 'gil'" : "clock: 'auto' or 'monotonic'");
    return nullptr;
  }
  if (method || rt != Py_None) {
    static bool gil_walk = false, realtime = true;  // the last values given
    if (method) gil_walk = !strcmp(method, "gil");
    if (rt != Py_None) {
      const int on = PyObject_IsTrue(rt);
      if (on < 0) return nullptr;
      realtime = on;
    }
    set_pysampler_options(gil_walk, realtime);
  }
  if (proc_root) set_proc_root(proc_root);
  if (clock) choose_clock(!strcmp(clock, "monotonic"));
  Py_RETURN_NONE;
}

PyMethodDef g_methods[] = {
    {"configure", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_configure)),
     METH_VARARGS | METH_KEYWORDS,
     "configure(clock=None, pysample_method=None, pysample_rt=None, proc_root=None): the native core's "
     "settings from core/config.py (None: unchanged)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool add_settings(PyObject* module) { return PyModule_AddFunctions(module, g_methods) == 0; }

}  // namespace stepscope
