// The Python sampler's Python API: pysampler_start/stop/status and, for tests, a
// code object's lines as the frame reader decodes them.
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>  // PyFrame_GetBack: Python.h declares it only from 3.11
#endif

#include <pthread.h>
#include <time.h>

#include "record/pysampler.h"
#include "record/pysampler_state.h"

namespace stepscope {
namespace pysampler {
namespace {

PyObject* py_start(PyObject*, PyObject* arg) {
  const long hz = PyLong_AsLong(arg);
  if (hz == -1 && PyErr_Occurred()) return nullptr;
  std::string err;
  g_p.interp = PyInterpreterState_Get();  // the sampler reads this interpreter's threads
  Py_BEGIN_ALLOW_THREADS  // stopping a running sampler joins a thread that may wait for the GIL
  err = start(int(hz));
  Py_END_ALLOW_THREADS
  return PyUnicode_FromStringAndSize(err.data(), Py_ssize_t(err.size()));
}

PyObject* py_stop(PyObject*, PyObject*) {
  Py_BEGIN_ALLOW_THREADS
  stop_pysampler();
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* py_status(PyObject*, PyObject*) {
  bool running;
  int hz;
  pid_t owner;
  int64_t cpu_ns = -1;
  {
    std::lock_guard<std::mutex> lk(g_p.mu);
    running = g_p.running;
    hz = g_p.hz;
    owner = g_p.owner;
    clockid_t cid;
    timespec ts;
    if (running && pthread_getcpuclockid(g_p.thread, &cid) == 0 && clock_gettime(cid, &ts) == 0)
      cpu_ns = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }
  const char* method = (running ? g_p.read_frames : reads_frames()) ? "frames" : "gil";
  const bool realtime = running && g_p.realtime;
  std::lock_guard<std::mutex> dl(g_p.data_mu);
  return Py_BuildValue("{s:O,s:O,s:i,s:i,s:s,s:L,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:L,s:L,s:L,s:n,s:n,s:n}", "running",
                       running ? Py_True : Py_False, "realtime", realtime ? Py_True : Py_False, "hz", hz, "pid", int(owner), "method", method, "read_ns", (long long)g_p.read_ns.load(), "samples",
                       (unsigned long long)g_p.taken, "dropped", (unsigned long long)g_p.dropped, "torn",
                       (unsigned long long)g_p.torn, "missed", (unsigned long long)g_p.missed, "passes", (unsigned long long)g_p.passes, "late",
                       (unsigned long long)g_p.late, "main_passes",
                       (unsigned long long)g_p.main_passes, "gil_passes", (unsigned long long)g_p.gil_passes,
                       "bytes", (unsigned long long)g_p.bytes, "cpu_ns", (long long)cpu_ns, "gil_wait_ns",
                       (long long)g_p.gil_wait_ns, "hold_ns", (long long)g_p.hold_ns, "strings",
                       Py_ssize_t(g_p.strings.size()), "frames", Py_ssize_t(g_p.frames.size()), "stacks",
                       Py_ssize_t(g_p.stacks.size()));
}

// For tests: the line of every instruction of a code object as the frame reader
// decodes it from a copy of its line table (compare with code.co_lines()); None
// where this build does not read frames.
PyObject* py_lines(PyObject*, PyObject* code) {
  if (!PyCode_Check(code)) {
    PyErr_SetString(PyExc_TypeError, "a code object");
    return nullptr;
  }
  pyframes::Code c;
  if (!pyframes::compiled_in() || !pyframes::usable() || !pyframes::read_names(uintptr_t(code), &c)) Py_RETURN_NONE;
  PyObject* out = PyList_New(c.size);
  for (int32_t i = 0; out && i < c.size; ++i) PyList_SET_ITEM(out, i, PyLong_FromLong(pyframes::line_at(c, i)));
  return out;
}

PyMethodDef g_methods[] = {
    {"pysampler_start", py_start, METH_O,
     "pysampler_start(hz): samples every thread's Python stack hz times a second; '' or the reason it cannot"},
    {"pysampler_stop", py_stop, METH_NOARGS, "Stops the Python stack sampler (its samples reach the trace)."},
    {"pysampler_status", py_status, METH_NOARGS,
     "The Python sampler's state and counters (samples, dropped, bytes, the thread's CPU time)."},
    {"_pysampler_lines", py_lines, METH_O, "For tests: a code object's lines per instruction, as the frame reader reads them."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace
}  // namespace pysampler

PyMethodDef* pysampler_methods() { return pysampler::g_methods; }

}  // namespace stepscope
