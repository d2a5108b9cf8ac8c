// Python stack sampler. A native thread wakes `hz` times a second on average
// (random intervals: see jittered()) and samples every thread's Python stack.
// Two methods. On CPython 3.11-3.13 (GIL builds) it copies the frames without the GIL
// (pyframes.cc; frames_pass() below): samples at times of its own, no thread
// waits for it. Elsewhere, or with STEPSCOPE_PYSAMPLE_METHOD=gil, the GIL walk:
// it takes the GIL (so every other thread is at a safe point), takes each thread's top frame
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
// all again. The GIL walk keeps code objects alive (one reference each) so their
// addresses stay unique keys; the frame reader checks a code address against
// the identity copied at its first sighting (code_at()). Every table is bounded (kMax*): a program that
// makes code as it runs (exec, generated lambdas) sees its newer code as one
// frame, kOtherCode, under its callers, and a stack past the bound is dropped
// and counted; memory stays within a few MiB whatever the program runs.
//
// This file: the sampler thread (its schedule, quiet passes, fork, start and stop).
// The GIL walk, the frame reader, the interning, the Python API and the chunks the
// writer takes are in pysampler_gilwalk.cc, pysampler_framereader.cc,
// pysampler_tables.h, pysampler_python.cc and pysampler_encode.cc.
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>  // PyFrame_GetBack: Python.h declares it only from 3.11
#endif

#include "record/pysampler.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

#include "record/pysampler_state.h"
#include "record/recorder.h"

namespace stepscope {
namespace pysampler {

State g_p;

namespace {

// From the settings (core/config.py), read at each start: STEPSCOPE_PYSAMPLE_METHOD=gil,
// STEPSCOPE_PYSAMPLE_RT=0 (see wake_on_time).
std::atomic<bool> g_gil_walk{false};
std::atomic<bool> g_realtime{true};

// The frame reader samples when it wakes: a sampler that waits for a free core
// tends to run as the job blocks and frees one, and over-counts blocking code
// (measured on a 2-core VM at load 5: a 75% pure-Python share sampled at 60%).
// The lowest real-time priority (SCHED_FIFO 1) wakes it on time: it sleeps all
// but ~20 us a pass, and the kernel's real-time throttling bounds it regardless.
// Where the process may not (no CAP_SYS_NICE, RLIMIT_RTPRIO 0) it stays as it is;
// STEPSCOPE_PYSAMPLE_RT=0 leaves it as it is anyway.
void wake_on_time() {
  if (!g_realtime) return;
  sched_param p{};
  p.sched_priority = 1;
  g_p.realtime = pthread_setschedparam(pthread_self(), SCHED_FIFO, &p) == 0;
}

// The next interval: uniform in [interval/2, 3*interval/2), the mean rate kept. A
// fixed period locks onto a loop on a fixed schedule (a 30 ms step sampled every
// 10 ms sees the same three moments of every step: a 3 ms helper was measured at
// 4.7% of the samples for 11.4% of the time); random phases cannot.
std::chrono::nanoseconds jittered(std::chrono::nanoseconds interval, uint64_t* rng) {
  uint64_t x = *rng;  // xorshift64
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *rng = x;
  const int64_t n = interval.count();
  return std::chrono::nanoseconds(n / 2 + int64_t(x % uint64_t(n > 0 ? n : 1)));
}

// Whether every thread the last pass sampled is asleep (blocked: S or D in
// /proc), not merely kept off a core: a runnable thread starved for the
// kQuietPasses passes would run as soon as it gets one, and lose samples.
bool all_asleep() {
  for (uint64_t tid : g_p.sampled_tids) {
    char path[64], buf[512];
    std::snprintf(path, sizeof path, "/proc/self/task/%llu/stat", (unsigned long long)tid);
    FILE* f = std::fopen(path, "re");
    if (!f) continue;  // gone
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = 0;
    const char* close = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
    if (!close || close[1] != ' ' || (close[2] != 'S' && close[2] != 'D')) return false;
  }
  return true;
}

// Hands a pass's additions to the writer (the mutex it shares with the writer only).
void publish(int passes, bool late, bool by_main, bool took_gil, int64_t wait_ns, int64_t hold_ns) {
  {
    std::lock_guard<std::mutex> dl(g_p.data_mu);
    for (auto& s : g_p.new_strings) g_p.strings.push_back(std::move(s));
    g_p.frames.insert(g_p.frames.end(), g_p.new_frames.begin(), g_p.new_frames.end());
    g_p.stacks.insert(g_p.stacks.end(), g_p.new_stacks.begin(), g_p.new_stacks.end());
    const size_t room = g_p.samples.size() < kMaxPending ? kMaxPending - g_p.samples.size() : 0;
    const size_t take = std::min(room, g_p.new_samples.size());
    g_p.samples.insert(g_p.samples.end(), g_p.new_samples.begin(), g_p.new_samples.begin() + long(take));
    g_p.dropped += g_p.new_samples.size() - take + g_p.pass_dropped;
    g_p.torn += g_p.pass_torn;
    g_p.missed += g_p.pass_missed;
    g_p.pass_dropped = g_p.pass_torn = g_p.pass_missed = 0;
    g_p.taken += take;
    g_p.passes += passes;
    g_p.late += late;
    g_p.main_passes += by_main;
    g_p.gil_passes += took_gil;
    g_p.gil_wait_ns += wait_ns;
    g_p.hold_ns += hold_ns;
  }
  g_p.new_strings.clear();
  g_p.new_frames.clear();
  g_p.new_stacks.clear();
  g_p.new_samples.clear();
}

void* sampler_main(void*) {
  pthread_setname_np(pthread_self(), "stepscope-pysmp");
  if (g_p.read_frames) wake_on_time();
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
  uint64_t rng = uint64_t(mono_ns()) | 1;
  int quiet = 0;                // the frame reader's passes in a row in which no thread ran
  std::vector<int64_t> passed;  // instants slept through since (CLOCK_MONOTONIC ns)
  TickRate rate{ticks(), mono_ns()};
  while (!g_p.stop) {
    lk.unlock();
    // Never take the GIL once finalization began: a daemon thread that does
    // is made to exit inside PyEval_RestoreThread (3.9-3.13).
    if (SS_FINALIZING()) break;
    const int64_t t0 = mono_ns();
    int64_t t1 = t0, t2 = t0;
    bool by_main = false, took_gil = false;
    int64_t read_ns = 0;  // the frame reader's pass, without the GIL
    // Woken late: no core was free at the pass's time. The pass then tends to run
    // when a core frees up, often as the job blocks: shares lean to blocking code.
    const bool late = std::chrono::steady_clock::now() - next > std::max(interval / 10, kLate);
    if (g_p.read_frames) {
      {
        std::lock_guard<std::mutex> tl(g_p.tables_mu);
        quiet = frames_pass(passed, rate) ? quiet + 1 : 0;
      }
      const int64_t asked = mono_ns();
      read_ns = asked - t0;
      int64_t h1 = asked, h2 = asked;
      took_gil = look_up_threads(self, false, &h1, &h2);
      t1 = t0 + (h1 - asked);  // the wait for the GIL, and its hold: not the read
      t2 = t1 + (h2 - h1);
    } else {
      by_main = one_pass(self, grace, since_miss == 0 || since_miss % kRetry == 0, &t1, &t2);
      since_miss = by_main ? 0 : since_miss + 1;
      took_gil = !by_main;
    }
    {
      std::lock_guard<std::mutex> tl(g_p.tables_mu);
      publish(1, late, by_main, took_gil, t1 - t0, t2 - t1);
      g_p.read_ns += read_ns;  // (tables_mu: the sampler's; status reads it as a plain counter)
    }
    lk.lock();
    next += jittered(interval, &rng);
    passed.clear();
    if (quiet == kQuietPasses && !all_asleep()) quiet = 0;  // (checked as it turns quiet: /proc is dear)
    if (quiet >= kQuietPasses) {  // sleep through the next kQuietSpan's instants (see frames_pass)
      const auto horizon = next + kQuietSpan;
      for (auto after = next + jittered(interval, &rng); after <= horizon; after += jittered(interval, &rng)) {
        passed.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(next.time_since_epoch()).count());
        next = after;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (next < now) next = now;  // fell behind (a long GIL wait): skip, never burst
    g_p.cv.wait_until(lk, next, [] { return g_p.stop; });
  }
  if (lk.owns_lock()) lk.unlock();
  if (g_p.read_frames) {  // the last samples of threads not looked up yet
    int64_t t1 = 0, t2 = 0;
    const bool took_gil = look_up_threads(self, true, &t1, &t2);
    std::lock_guard<std::mutex> tl(g_p.tables_mu);
    g_p.waiting.clear();
    publish(0, false, false, took_gil, 0, t2 - t1);
  }
  if (!SS_FINALIZING()) {
    PyEval_RestoreThread(self);
    PyGILState_Release(gil);  // deletes our thread state
  }
  return nullptr;
}

// Fork: the sampler thread does not exist in the child; its state is dropped
// without joining, and the child starts none unless it starts a session of its own.
void at_fork_prepare() {
  g_p.tables_mu.lock();
  g_p.data_mu.lock();
}
void at_fork_parent() {
  g_p.data_mu.unlock();
  g_p.tables_mu.unlock();
}
void at_fork_child() {
  new (&g_p.tables_mu) std::mutex();
  g_p.threads_seen.clear();  // the child's threads are not the parent's
  g_p.waiting.clear();
  g_p.last_lookup_ns = 0;
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
  g_p.read_ns = 0;
  g_p.main_passes = g_p.gil_passes = g_p.torn = g_p.pass_torn = g_p.late = g_p.missed = g_p.pass_missed = 0;
  g_p.owner = 0;
  new (&g_p.pass_mu) std::mutex();
  new (&g_p.pass_cv) std::condition_variable();
  g_p.pass.store(kIdle);
  g_p.queued.store(false);  // a call left in CPython's queue finds the pass idle
}

}  // namespace

// The method a start uses: frames read without the GIL where this build knows
// the frame layout and the process may copy its own memory, unless
// STEPSCOPE_PYSAMPLE_METHOD=gil asks for the GIL walk (a comparison, a fallback).
bool reads_frames() {
  if (g_gil_walk) return false;
  return pyframes::compiled_in() && pyframes::usable();
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
    g_p.gil_passes = g_p.torn = g_p.late = g_p.missed = 0;
    g_p.gil_wait_ns = g_p.hold_ns = 0;
    g_p.read_ns = 0;
  }
  std::lock_guard<std::mutex> lk(g_p.mu);
  g_p.read_frames = reads_frames();
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

}  // namespace pysampler

using pysampler::g_p;

void set_pysampler_options(bool gil_walk, bool realtime) {
  pysampler::g_gil_walk = gil_walk;
  pysampler::g_realtime = realtime;
}

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

}  // namespace stepscope
