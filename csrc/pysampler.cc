// Python stack sampler. A native thread wakes `hz` times a second, takes the
// GIL (so every other thread is at a safe point), takes each thread's top frame
// from sys._current_frames() (which holds CPython's lock of the thread list:
// see walk()), walks the frames through the C API that CPython 3.9-3.13 all
// have (PyFrame_GetBack, PyFrame_GetCode, PyFrame_GetLineNumber), and releases
// the GIL before anything else: interning is done on thread-local tables,
// handing the pass to the writer takes a mutex only after the GIL is given back.
//
// Samples are wall-clock: a thread blocked in C with the GIL released (torch
// kernels, a queue wait) is sampled where it waits, which is where its time goes.
//
// Strings, frames (function, file, line) and stacks (parent stack, frame: a
// prefix tree, so a stack costs one entry per new leaf) are interned for the
// life of the process, with ids dense from 0; each new trace file gets them
// all again. Code objects seen are kept alive (one reference each) so their
// addresses stay unique keys. Every table is bounded (kMax*): a program that
// makes code as it runs (exec, generated lambdas) sees its newer code as one
// frame, kOtherCode, under its callers, and a stack past the bound is dropped
// and counted; memory stays within a few MiB whatever the program runs.
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>  // PyFrame_GetBack: Python.h declares it only from 3.11
#endif

#include "pysampler.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "encoding.h"
#include "format.h"
#include "recorder.h"

namespace stepscope {
namespace {

#if PY_VERSION_HEX >= 0x030D0000
#define SS_FINALIZING() Py_IsFinalizing()
#else
#define SS_FINALIZING() _Py_IsFinalizing()
#endif

constexpr int kMaxDepth = 512;                 // deeper stacks keep their innermost frames
constexpr size_t kMaxPending = size_t(1) << 20;  // samples queued while the writer stalls
constexpr size_t kMaxCodes = size_t(1) << 14;    // code objects kept alive: ~1 KiB each
constexpr size_t kMaxFrames = size_t(1) << 16;   // (code, line) frames, the last one kOtherCode
constexpr size_t kMaxStacks = size_t(1) << 18;
constexpr size_t kMaxOffsets = size_t(1) << 18;  // (code, instruction) -> frame: a cache only
constexpr const char* kOtherCode = "(other code: the sampler's tables are full)";
// A pass's owner: armed, the main thread walks it (pending call) unless the
// sampler claims it after the grace period; done, the main thread walked it.
enum PassState { kIdle, kArmed, kInMain, kDone, kSampler };
constexpr unsigned kRetry = 16;  // passes between offers to a main thread that did not come by

struct Frame {
  uint32_t func, file;
  int32_t line;
};
struct Sample {
  uint64_t tick;
  uint64_t tid;
  uint32_t stack;
};

struct CodeNames {
  uint32_t func, file;
};

struct State {
  // Control, guarded by mu.
  std::mutex mu;
  std::condition_variable cv;
  pthread_t thread{};
  bool running = false;
  bool stop = false;
  int hz = 100;
  pid_t owner = 0;

  // Tables and queue, guarded by data_mu; appended by the sampler thread only.
  std::mutex data_mu;
  std::vector<std::string> strings;
  std::vector<Frame> frames;
  std::vector<std::pair<int32_t, uint32_t>> stacks;  // (parent or -1, frame)
  std::vector<Sample> samples;
  size_t strings_written = 0, frames_written = 0, stacks_written = 0;
  uint64_t taken = 0, dropped = 0, passes = 0, bytes = 0;
  int64_t gil_wait_ns = 0, hold_ns = 0;
  uint64_t main_passes = 0;  // passes the main thread walked (a pending call), not the sampler

  // One pass's owner (see sampler_main): who walks it, the main thread or the sampler.
  std::atomic<int> pass{0};
  std::atomic<bool> queued{false};  // a pending call is in CPython's queue
  std::mutex pass_mu;
  std::condition_variable pass_cv;
  int64_t main_t1 = 0, main_t2 = 0;  // the main thread's walk, written before pass becomes kDone
  unsigned long sampler_ident = 0;   // the sampler thread's own ident: never sampled

  // Sampler thread only.
  std::unordered_map<std::string, uint32_t> string_ids;
  std::unordered_map<PyObject*, CodeNames> codes;  // holds a reference to each key
  std::unordered_map<uint64_t, uint32_t> frame_ids;  // code index << 32 | line
  std::unordered_map<uint64_t, uint32_t> offset_ids;  // code index << 32 | instruction offset
  std::unordered_map<PyObject*, uint32_t> code_index;
  std::unordered_map<uint64_t, uint32_t> stack_ids;  // (parent + 1) << 32 | frame
  uint32_t other_code = UINT32_MAX;                   // kOtherCode's frame, once made
  PyObject* threading_name = nullptr;  // "threading", made once
  PyObject* native_id_name = nullptr;  // "_native_id", made once
  PyObject* active_name = nullptr;     // "_active", made once
  PyObject* name_name = nullptr;       // "_name", made once
  PyObject* own_prefix = nullptr;      // "stepscope-": the names of stepscope's own threads
  // One pass's additions, moved to the shared tables after the GIL is released.
  std::vector<std::string> new_strings;
  std::vector<Frame> new_frames;
  std::vector<std::pair<int32_t, uint32_t>> new_stacks;
  std::vector<Sample> new_samples;
  uint64_t pass_dropped = 0;
} g_p;

uint32_t string_id(const char* s, size_t n) {
  std::string key(s, n);
  auto it = g_p.string_ids.find(key);
  if (it != g_p.string_ids.end()) return it->second;
  const uint32_t id = uint32_t(g_p.strings.size() + g_p.new_strings.size());
  g_p.new_strings.push_back(key);
  g_p.string_ids.emplace(std::move(key), id);
  return id;
}

uint32_t string_of(PyObject* o) {
  Py_ssize_t n = 0;
  const char* s = o && PyUnicode_Check(o) ? PyUnicode_AsUTF8AndSize(o, &n) : nullptr;
  if (!s) {
    PyErr_Clear();  // a name that is not valid UTF-8 (lone surrogates)
    return string_id("?", 1);
  }
  return string_id(s, size_t(n));
}

size_t frame_count() { return g_p.frames.size() + g_p.new_frames.size(); }

// The frame that stands for code the full tables have no room for (the slot kept for it).
uint32_t other_code_frame() {
  if (g_p.other_code == UINT32_MAX) {
    g_p.other_code = uint32_t(frame_count());
    g_p.new_frames.push_back({string_id(kOtherCode, std::strlen(kOtherCode)), string_id("", 0), 0});
  }
  return g_p.other_code;
}

// The frame id of (code, line), or the other-code frame once the tables are full; the
// code object is kept alive from its first sighting.
// Lines are found through the instruction offset: PyFrame_GetLineNumber scans the
// code's line table, so it runs once per distinct (code, offset), not per sample.
uint32_t frame_id(PyCodeObject* code, PyFrameObject* f) {
  PyObject* key = reinterpret_cast<PyObject*>(code);
  uint32_t ci;
  auto c = g_p.code_index.find(key);
  if (c == g_p.code_index.end()) {
    if (g_p.codes.size() >= kMaxCodes || frame_count() + 1 >= kMaxFrames) {
      return other_code_frame();
    }
#if PY_VERSION_HEX >= 0x030B0000
    PyObject* name = code->co_qualname;  // Class.method
#else
    PyObject* name = code->co_name;
#endif
    CodeNames names{string_of(name), string_of(code->co_filename)};
    Py_INCREF(key);
    ci = uint32_t(g_p.codes.size());
    g_p.codes.emplace(key, names);
    g_p.code_index.emplace(key, ci);
  } else {
    ci = c->second;
  }
#if PY_VERSION_HEX >= 0x030B0000
  const int lasti = PyFrame_GetLasti(f);
#else
  const int lasti = f->f_lasti;
#endif
  const uint64_t at = (uint64_t(ci) << 32) | uint32_t(lasti);
  auto hit = g_p.offset_ids.find(at);
  if (hit != g_p.offset_ids.end()) {
    return hit->second;
  }
  const bool cache = g_p.offset_ids.size() < kMaxOffsets;
  const int line = PyFrame_GetLineNumber(f);
  const uint64_t k = (uint64_t(ci) << 32) | uint32_t(line);
  auto it = g_p.frame_ids.find(k);
  if (it != g_p.frame_ids.end()) {
    if (cache) g_p.offset_ids.emplace(at, it->second);
    return it->second;
  }
  if (frame_count() + 1 >= kMaxFrames) {
    return other_code_frame();
  }
  const CodeNames& names = g_p.codes[key];
  const uint32_t id = uint32_t(frame_count());
  g_p.new_frames.push_back({names.func, names.file, line});
  g_p.frame_ids.emplace(k, id);
  if (cache) g_p.offset_ids.emplace(at, id);
  return id;
}

// A stack's id, or -2 where the table is full (the sample is dropped and counted).
int64_t stack_id(int32_t parent, uint32_t frame) {
  const uint64_t k = (uint64_t(uint32_t(parent + 1)) << 32) | frame;
  auto it = g_p.stack_ids.find(k);
  if (it != g_p.stack_ids.end()) return it->second;
  const size_t n = g_p.stacks.size() + g_p.new_stacks.size();
  if (n >= kMaxStacks) return -2;
  g_p.new_stacks.emplace_back(parent, frame);
  g_p.stack_ids.emplace(k, uint32_t(n));
  return uint32_t(n);
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
    int64_t stack = -1;
    for (int i = depth - 1; i >= 0 && stack != -2; --i) stack = stack_id(int32_t(stack), ids[i]);
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

void* sampler_main(void*) {
  pthread_setname_np(pthread_self(), "stepscope-pysmp");
  if (SS_FINALIZING()) return nullptr;
  // A thread state of our own, made once: per-sample PyGILState_Ensure/Release
  // pairs would create and destroy one at every pass.
  PyGILState_STATE gil = PyGILState_Ensure();
  PyThreadState* self = PyThreadState_Get();
  g_p.sampler_ident = PyThread_get_thread_ident();
  if (!g_p.threading_name) g_p.threading_name = PyUnicode_InternFromString("threading");
  if (!g_p.native_id_name) g_p.native_id_name = PyUnicode_InternFromString("_native_id");
  if (!g_p.active_name) g_p.active_name = PyUnicode_InternFromString("_active");
  if (!g_p.name_name) g_p.name_name = PyUnicode_InternFromString("_name");
  if (!g_p.own_prefix) g_p.own_prefix = PyUnicode_InternFromString("stepscope-");
  PyEval_SaveThread();
  auto next = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(g_p.mu);
  const auto interval = std::chrono::nanoseconds(1000000000 / g_p.hz);
  const auto grace = std::min(interval / 4, std::chrono::nanoseconds(2000000));
  unsigned since_miss = 0;  // passes since the main thread last walked one (0: it walked the last)
  while (!g_p.stop) {
    lk.unlock();
    // Never take the GIL once finalization began: a daemon thread that does
    // is made to exit inside PyEval_RestoreThread (3.9-3.13).
    if (SS_FINALIZING()) break;
    const int64_t t0 = mono_ns();
    int64_t t1 = t0, t2 = t0;
    const bool by_main = one_pass(self, grace, since_miss == 0 || since_miss % kRetry == 0, &t1, &t2);
    since_miss = by_main ? 0 : since_miss + 1;
    {
      std::lock_guard<std::mutex> dl(g_p.data_mu);
      for (auto& s : g_p.new_strings) g_p.strings.push_back(std::move(s));
      g_p.frames.insert(g_p.frames.end(), g_p.new_frames.begin(), g_p.new_frames.end());
      g_p.stacks.insert(g_p.stacks.end(), g_p.new_stacks.begin(), g_p.new_stacks.end());
      const size_t room = g_p.samples.size() < kMaxPending ? kMaxPending - g_p.samples.size() : 0;
      const size_t take = std::min(room, g_p.new_samples.size());
      g_p.samples.insert(g_p.samples.end(), g_p.new_samples.begin(), g_p.new_samples.begin() + long(take));
      g_p.dropped += g_p.new_samples.size() - take + g_p.pass_dropped;
      g_p.pass_dropped = 0;
      g_p.taken += take;
      ++g_p.passes;
      g_p.main_passes += by_main;
      g_p.gil_wait_ns += t1 - t0;
      g_p.hold_ns += t2 - t1;
    }
    g_p.new_strings.clear();
    g_p.new_frames.clear();
    g_p.new_stacks.clear();
    g_p.new_samples.clear();
    lk.lock();
    next += interval;
    const auto now = std::chrono::steady_clock::now();
    if (next < now) next = now;  // fell behind (a long GIL wait): skip, never burst
    g_p.cv.wait_until(lk, next, [] { return g_p.stop; });
  }
  if (lk.owns_lock()) lk.unlock();
  if (!SS_FINALIZING()) {
    PyEval_RestoreThread(self);
    PyGILState_Release(gil);  // deletes our thread state
  }
  return nullptr;
}

// Fork: the sampler thread does not exist in the child; its state is dropped
// without joining, and the child starts none unless it starts a session of its own.
void at_fork_prepare() { g_p.data_mu.lock(); }
void at_fork_parent() { g_p.data_mu.unlock(); }
void at_fork_child() {
  new (&g_p.mu) std::mutex();
  new (&g_p.cv) std::condition_variable();
  new (&g_p.data_mu) std::mutex();
  g_p.thread = pthread_t{};
  g_p.running = false;
  g_p.stop = false;
  g_p.samples.clear();  // the parent's samples are the parent's
  g_p.new_samples.clear();
  g_p.strings_written = g_p.frames_written = g_p.stacks_written = 0;
  g_p.taken = g_p.dropped = g_p.passes = g_p.bytes = g_p.pass_dropped = 0;
  g_p.gil_wait_ns = g_p.hold_ns = 0;
  g_p.main_passes = 0;
  g_p.owner = 0;
  new (&g_p.pass_mu) std::mutex();
  new (&g_p.pass_cv) std::condition_variable();
  g_p.pass.store(kIdle);
  g_p.queued.store(false);  // a call left in CPython's queue finds the pass idle
}

std::string start(int hz) {
#ifdef Py_GIL_DISABLED
  // Without a GIL, holding "the GIL" does not stop the other threads: their frames could change mid-walk.
  if (hz > 0) return "not supported on a free-threaded (no GIL) Python build";
#endif
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(at_fork_prepare, at_fork_parent, at_fork_child); });
  stop_pysampler();
  if (hz <= 0) return {};
  {
    std::lock_guard<std::mutex> dl(g_p.data_mu);
    g_p.samples.clear();
    // A new trace file: every string, frame and stack is written into it again.
    g_p.strings_written = g_p.frames_written = g_p.stacks_written = 0;
    g_p.taken = g_p.dropped = g_p.passes = g_p.bytes = g_p.main_passes = 0;
    g_p.gil_wait_ns = g_p.hold_ns = 0;
  }
  std::lock_guard<std::mutex> lk(g_p.mu);
  g_p.hz = hz;
  g_p.stop = false;
  g_p.owner = getpid();
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, size_t(1) << 20);
  const int err = pthread_create(&g_p.thread, &attr, sampler_main, nullptr);
  pthread_attr_destroy(&attr);
  if (err != 0) return std::string("cannot start the Python sampler thread: ") + std::strerror(err);
  g_p.running = true;
  return {};
}

// ------------------------------------------------------------ Python API

PyObject* py_start(PyObject*, PyObject* arg) {
  const long hz = PyLong_AsLong(arg);
  if (hz == -1 && PyErr_Occurred()) return nullptr;
  std::string err;
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
  std::lock_guard<std::mutex> dl(g_p.data_mu);
  return Py_BuildValue("{s:O,s:i,s:i,s:K,s:K,s:K,s:K,s:K,s:L,s:L,s:L,s:n,s:n,s:n}", "running",
                       running ? Py_True : Py_False, "hz", hz, "pid", int(owner), "samples",
                       (unsigned long long)g_p.taken, "dropped", (unsigned long long)g_p.dropped, "passes",
                       (unsigned long long)g_p.passes, "main_passes", (unsigned long long)g_p.main_passes, "bytes", (unsigned long long)g_p.bytes, "cpu_ns",
                       (long long)cpu_ns, "gil_wait_ns", (long long)g_p.gil_wait_ns, "hold_ns",
                       (long long)g_p.hold_ns, "strings", Py_ssize_t(g_p.strings.size()), "frames",
                       Py_ssize_t(g_p.frames.size()), "stacks", Py_ssize_t(g_p.stacks.size()));
}

PyMethodDef g_methods[] = {
    {"pysampler_start", py_start, METH_O,
     "pysampler_start(hz): samples every thread's Python stack hz times a second; '' or the reason it cannot"},
    {"pysampler_stop", py_stop, METH_NOARGS, "Stops the Python stack sampler (its samples reach the trace)."},
    {"pysampler_status", py_status, METH_NOARGS,
     "The Python sampler's state and counters (samples, dropped, bytes, the thread's CPU time)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PyMethodDef* pysampler_methods() { return g_methods; }

void stop_pysampler() {
  pthread_t thread;
  {
    std::lock_guard<std::mutex> lk(g_p.mu);
    if (!g_p.running) return;
    g_p.stop = true;
    g_p.running = false;
    thread = g_p.thread;
  }
  g_p.cv.notify_all();
  pthread_join(thread, nullptr);
}

// PYSTACKS: first string id, count, (len, bytes)...; first frame id, count,
// (function, file, line)...; first stack id, count, (parent + 1, frame)...
// PYSAMPLES: interval_ns, count, thread count, OS thread ids..., base_ns, then
// per sample zigzag(time - previous time), thread index, stack id.
void encode_pysamples(std::string& out) {
  std::vector<std::string> strings;
  std::vector<Frame> frames;
  std::vector<std::pair<int32_t, uint32_t>> stacks;
  std::vector<Sample> samples;
  size_t s0, f0, k0;
  int hz;
  {
    std::lock_guard<std::mutex> lk(g_p.mu);
    hz = g_p.hz;
  }
  {
    std::lock_guard<std::mutex> dl(g_p.data_mu);
    if (g_p.samples.empty() && g_p.strings_written == g_p.strings.size() &&
        g_p.frames_written == g_p.frames.size() && g_p.stacks_written == g_p.stacks.size())
      return;
    s0 = g_p.strings_written;
    f0 = g_p.frames_written;
    k0 = g_p.stacks_written;
    strings.assign(g_p.strings.begin() + long(s0), g_p.strings.end());
    frames.assign(g_p.frames.begin() + long(f0), g_p.frames.end());
    stacks.assign(g_p.stacks.begin() + long(k0), g_p.stacks.end());
    g_p.strings_written = g_p.strings.size();
    g_p.frames_written = g_p.frames.size();
    g_p.stacks_written = g_p.stacks.size();
    samples.swap(g_p.samples);
  }
  const size_t before = out.size();
  if (!strings.empty() || !frames.empty() || !stacks.empty()) {
    std::string p;
    put_varint(p, s0);
    put_varint(p, strings.size());
    for (const std::string& s : strings) {
      put_varint(p, s.size());
      p += s;
    }
    put_varint(p, f0);
    put_varint(p, frames.size());
    for (const Frame& f : frames) {
      put_varint(p, f.func);
      put_varint(p, f.file);
      put_varint(p, zigzag(f.line));
    }
    put_varint(p, k0);
    put_varint(p, stacks.size());
    for (const auto& [parent, frame] : stacks) {
      put_varint(p, uint64_t(int64_t(parent) + 1));
      put_varint(p, frame);
    }
    append_chunk(out, kChunkPyStacks, p);
  }
  if (!samples.empty()) {
    std::vector<uint64_t> tids;
    std::unordered_map<uint64_t, uint32_t> index;
    for (const Sample& s : samples)
      if (index.emplace(s.tid, uint32_t(tids.size())).second) tids.push_back(s.tid);
    std::string p;
    p.reserve(samples.size() * 5 + tids.size() * 4 + 32);
    put_varint(p, uint64_t(1000000000 / (hz > 0 ? hz : 100)));
    put_varint(p, samples.size());
    put_varint(p, tids.size());
    for (uint64_t t : tids) put_varint(p, t);
    int64_t prev = converter().to_ns(samples[0].tick);
    put_varint(p, zigzag(prev));
    for (const Sample& s : samples) {
      const int64_t ns = converter().to_ns(s.tick);
      put_varint(p, zigzag(ns - prev));
      prev = ns;
      put_varint(p, index[s.tid]);
      put_varint(p, s.stack);
    }
    append_chunk(out, kChunkPySamples, p);
  }
  std::lock_guard<std::mutex> dl(g_p.data_mu);
  g_p.bytes += out.size() - before;
}

}  // namespace stepscope
