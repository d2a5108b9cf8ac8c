// The Python sampler's GIL walk: with the GIL held (the main thread's pending call,
// else the sampler's), every thread's frames through sys._current_frames() and the C API.
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>  // PyFrame_GetBack: Python.h declares it only from 3.11
#endif

#include <pthread.h>
#include <time.h>

#include "record/pysampler_tables.h"
#include "record/recorder.h"

namespace stepscope {
namespace pysampler {
namespace {

// The GIL walk's frame id: its code objects are kept alive (one reference each)
// so their addresses stay unique keys.
uint32_t frame_id(PyCodeObject* code, PyFrameObject* f) {
  PyObject* key = reinterpret_cast<PyObject*>(code);
  uint32_t ci;
  auto c = g_p.code_index.find(key);
  if (c == g_p.code_index.end()) {
#if PY_VERSION_HEX >= 0x030B0000
    PyObject* name = code->co_qualname;  // Class.method
#else
    PyObject* name = code->co_name;
#endif
    if (!new_code(string_of(name), string_of(code->co_filename), &ci)) return other_code_frame();
    Py_INCREF(key);
    g_p.code_index.emplace(key, ci);
  } else {
    ci = c->second;
  }
#if PY_VERSION_HEX >= 0x030B0000
  const int lasti = PyFrame_GetLasti(f);
#else
  const int lasti = f->f_lasti;
#endif
  return frame_at(ci, lasti, [f] { return PyFrame_GetLineNumber(f); });
}

// The OS thread id of a live thread, from its pthread handle (the ident): the
// CPU clock id glibc makes of it encodes the kernel's thread id (Linux's
// MAKE_THREAD_CPUCLOCK: ~tid << 3 | 6). 0 where that is not the encoding.
uint64_t tid_of_pthread(unsigned long ident) {
#ifdef __linux__
  clockid_t cid;
  if (pthread_getcpuclockid(pthread_t(ident), &cid) == 0 && (cid & 7) == 6) {
    const long tid = ~(long(cid) >> 3);
    if (tid > 0) return uint64_t(tid);
  }
#endif
  return 0;
}

// The OS thread id, which the trace's tracks use (threading.get_native_id()):
// threading's registry (a dict of Thread objects by ident; _native_id is a plain
// attribute) knows it for threads that threading started or met. A thread that
// only native code started (one that calls into Python through PyGILState_Ensure:
// autograd's device threads, gloo's) is not there: its pthread handle tells it
// (the thread is alive: it has a Python frame), else its ident stands in. Returns
// 0 for stepscope's own Python threads (named "stepscope-..."): not the job's time.
uint64_t native_id(PyObject* active, PyObject* ident) {
  uint64_t tid = 0;
  const bool names = g_p.native_id_name && g_p.name_name && g_p.own_prefix;
  PyObject* thread = active && names && PyDict_Check(active) ? PyDict_GetItemWithError(active, ident) : nullptr;
  if (thread) {
    if (PyObject* name = PyObject_GetAttr(thread, g_p.name_name)) {
      const bool ours = PyUnicode_Check(name) && PyUnicode_Tailmatch(name, g_p.own_prefix, 0, PY_SSIZE_T_MAX, -1) == 1;
      Py_DECREF(name);
      if (ours) return 0;
    }
    if (PyObject* n = PyObject_GetAttr(thread, g_p.native_id_name)) {
      tid = PyLong_Check(n) ? PyLong_AsUnsignedLongLong(n) : 0;
      Py_DECREF(n);
    }
  }
  PyErr_Clear();
  if (tid == uint64_t(-1) || tid == 0) {
    const unsigned long handle = PyLong_AsUnsignedLong(ident);
    tid = PyErr_Occurred() ? 0 : tid_of_pthread(handle);
    PyErr_Clear();
    if (tid == 0) tid = handle;
  }
  return tid == uint64_t(-1) ? 0 : tid;
}

// One pass with the GIL held: every thread with a Python frame, but ours.
//
// The frames come from sys._current_frames(), which walks the interpreter's
// thread states under CPython's own lock of that list. The GIL alone does not
// make that walk safe: a thread that native code started creates its thread
// state (PyGILState_Ensure, pybind11's gil_scoped_acquire) without holding the
// GIL, and a sampler that walked the list itself read one half made and crashed
// (seen in a Lightning DDP job on gloo: SIGSEGV in PyThreadState_GetFrame).
void walk() {
  const uint64_t tick = ticks();
  PyObject* current_frames = PySys_GetObject("_current_frames");  // borrowed
  PyObject* frames = current_frames ? PyObject_CallNoArgs(current_frames) : nullptr;
  if (!frames || !PyDict_Check(frames)) {
    Py_XDECREF(frames);
    PyErr_Clear();
    return;
  }
  PyObject* threading = g_p.threading_name ? PyImport_GetModule(g_p.threading_name) : nullptr;  // new ref
  PyObject* active = threading && g_p.active_name ? PyObject_GetAttr(threading, g_p.active_name) : nullptr;
  PyErr_Clear();
  const unsigned long self = g_p.sampler_ident;
  uint32_t ids[kMaxDepth];
  PyObject *ident, *top;
  Py_ssize_t pos = 0;
  while (PyDict_Next(frames, &pos, &ident, &top)) {
    if (PyLong_AsUnsignedLong(ident) == self || !PyFrame_Check(top)) {
      PyErr_Clear();
      continue;
    }
    const uint64_t tid = native_id(active, ident);
    if (tid == 0) continue;  // stepscope's own thread
    PyFrameObject* f = reinterpret_cast<PyFrameObject*>(top);
    Py_INCREF(f);
    int depth = 0;
    while (f) {
      PyCodeObject* code = PyFrame_GetCode(f);
      if (depth < kMaxDepth) ids[depth++] = frame_id(code, f);
      Py_DECREF(code);
      PyFrameObject* back = PyFrame_GetBack(f);
      Py_DECREF(f);
      f = back;
      if (depth == kMaxDepth) {  // keep the innermost frames: that is where the time goes
        Py_XDECREF(f);
        break;
      }
    }
    const int64_t stack = stack_of(ids, depth);
    if (stack < 0) {
      ++g_p.pass_dropped;  // the stack table is full
      continue;
    }
    g_p.new_samples.push_back({tick, tid, uint32_t(stack)});
  }
  Py_XDECREF(active);
  Py_XDECREF(threading);
  Py_DECREF(frames);
}
// The pending call: the main thread walks the pass itself, at its next eval-breaker
// check, with the GIL it already holds. Runs only if the pass is still armed (the
// sampler may have claimed it, or stopped). Never raises into the job.
int main_walk(void*) {
  g_p.queued.store(false);
  int armed = kArmed;
  if (!g_p.pass.compare_exchange_strong(armed, kInMain)) return 0;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  g_p.main_t1 = mono_ns();
  try {
    walk();
  } catch (...) {  // std::bad_alloc in the tables: the pass is lost, the job goes on
  }
  g_p.main_t2 = mono_ns();
  PyErr_Restore(type, value, traceback);
  {
    std::lock_guard<std::mutex> pl(g_p.pass_mu);
    g_p.pass.store(kDone);
  }
  g_p.pass_cv.notify_one();
  return 0;
}

}  // namespace

// One pass, walked by whichever thread costs the job less. The sampler first asks
// the main thread through Py_AddPendingCall: the main thread runs it when it next
// takes the GIL back (after a torch op: microseconds in a training loop) and walks
// with the GIL it holds, no hand-over. Taking the GIL from here instead makes the
// main thread, back from its op, wait for our walk and a thread wake-up (~60 us a
// pass on the development VM, 3-4 us a step at 100 Hz; BENCHMARKS.md). If the main
// thread does not come by within the grace period (blocked in C with the GIL
// released, or running pure Python that releases nothing), the sampler claims the
// pass and takes the GIL itself, as it always did: free in the first case, the
// 5 ms switch interval in the second. (On 3.11 a pending call added from another
// thread does not trip the main thread's eval breaker; its next GIL take does.)
// A main thread that did not come by is asked again only every kRetry passes
// (while it is away, each offer would cost the grace period's delay, and on 3.12+
// other threads trip their eval breaker until the main thread runs the call).
// Fills t1/t2 (the walk) and returns whether the main thread walked it.
bool one_pass(PyThreadState* self, std::chrono::nanoseconds grace, bool offer, int64_t* t1, int64_t* t2) {
  g_p.pass.store(kArmed);
  if (offer) {
    if (!g_p.queued.exchange(true) && Py_AddPendingCall(main_walk, nullptr) != 0) g_p.queued.store(false);
    std::unique_lock<std::mutex> pl(g_p.pass_mu);
    g_p.pass_cv.wait_for(pl, grace, [] { return g_p.pass.load() == kDone; });
  }
  int armed = kArmed;
  if (g_p.pass.compare_exchange_strong(armed, kSampler)) {
    PyEval_RestoreThread(self);
    *t1 = mono_ns();
    walk();
    PyEval_SaveThread();
    *t2 = mono_ns();
    g_p.pass.store(kIdle);
    return false;
  }
  {
    std::unique_lock<std::mutex> pl(g_p.pass_mu);  // the main thread is walking: a few microseconds
    g_p.pass_cv.wait(pl, [] { return g_p.pass.load() == kDone; });
  }
  *t1 = g_p.main_t1;
  *t2 = g_p.main_t2;
  g_p.pass.store(kIdle);
  return true;
}

}  // namespace pysampler
}  // namespace stepscope
