// CUPTI activity tracing, with neither CUDA headers nor a link-time
// dependency: libcupti is dlopen'ed at run time (the copy torch loads, found by
// the Python side), its buffers are decoded natively (cupti_records.cc), and the records go
// through the GPU queue into the trace (gpu.h). A dense kernel stream produces
// hundreds of thousands of records a second: no Python runs on this path.
//
// The few CUPTI types used are declared in cupti_abi.h as plain numbers and byte
// offsets. They are facts of CUPTI's ABI, read from CUPTI 13.0's
// cupti_activity.h (CUPTI_API_VERSION 130001): CUpti_ActivityKernel10,
// CUpti_ActivityMemcpy6, CUpti_ActivityMemcpyPtoP4, CUpti_ActivityMemset4,
// CUpti_ActivitySynchronization2, CUpti_ActivityAPI. Only fields of the
// records' long-stable prefixes are read (the kernel's up to `name` is
// unchanged since CUpti_ActivityKernel4, so CUPTI 12.x delivers the same
// offsets); tests/test_gpu.py checks them against the headers where a CUDA
// toolkit is installed.
#include "record/cupti.h"
#include "record/cupti_abi.h"

#include <dlfcn.h>

#include <atomic>
#include <cctype>
#include <climits>
#include <new>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "common/clock.h"
#include "record/gpu.h"
#include "record/recorder.h"

namespace stepscope {
namespace cupti {

Api g_api;

}  // namespace cupti

using namespace cupti;

namespace {

std::mutex g_ctl_mu;  // start/stop/pause
std::atomic<bool> g_active{false};
bool g_paused = false;    // torch.profiler owns CUPTI
bool g_step_off = false;  // outside the STEPSCOPE_STEPS window
int32_t g_first_step = -1, g_last_step = -1;
uint32_t g_train_mode = 0;
bool g_clock_callback = false;






std::string result_text(CUptiResult r) {
  const char* s = nullptr;
  if (g_api.result_string && g_api.result_string(r, &s) == kSuccess && s) return s;
  return "CUPTI error " + std::to_string(r);
}

uint64_t mono_timestamp() { return uint64_t(mono_ns()); }
template <typename F>
bool load_symbol(F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(g_api.lib, name));
  return fn != nullptr;
}

std::string load(const std::string& library) {
  if (g_api.lib) return {};
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    return "cannot load " + library + ": " + (e ? e : "unknown error");
  }
  g_api.lib = lib;
  bool ok = load_symbol(g_api.register_callbacks, "cuptiActivityRegisterCallbacks") &&
            load_symbol(g_api.enable, "cuptiActivityEnable") && load_symbol(g_api.disable, "cuptiActivityDisable") &&
            load_symbol(g_api.next_record, "cuptiActivityGetNextRecord") &&
            load_symbol(g_api.flush_all, "cuptiActivityFlushAll") &&
            load_symbol(g_api.get_timestamp, "cuptiGetTimestamp");
  load_symbol(g_api.dropped, "cuptiActivityGetNumDroppedRecords");
  load_symbol(g_api.register_timestamp, "cuptiActivityRegisterTimestampCallback");
  load_symbol(g_api.result_string, "cuptiGetResultString");
  load_symbol(g_api.callback_name, "cuptiGetCallbackName");
  if (!ok) {
    g_api = Api{};  // the handle stays open: unloading CUPTI is never safe
    return library + " lacks the CUPTI activity API";
  }
  return {};
}

// CUPTI's clock -> CLOCK_MONOTONIC: the offset read where the two reads are closest.
int64_t measure_offset() {
  int64_t best_width = INT64_MAX, offset = 0;
  for (int i = 0; i < 16; ++i) {
    uint64_t c = 0;
    const int64_t a = mono_ns();
    if (g_api.get_timestamp(&c) != kSuccess) return 0;
    const int64_t b = mono_ns();
    if (b - a < best_width) {
      best_width = b - a;
      offset = (a + b) / 2 - int64_t(c);
    }
  }
  return offset;
}

bool driver_present() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h) dlclose(h);
  return h != nullptr;
}

std::string explain(CUptiResult r, const std::string& what) {
  std::string s = what + " failed: " + result_text(r);
  switch (r) {
    case kInsufficientPrivileges:
    case kVirtInsufficientPrivileges:
      return s + "; fix: allow profiling for non-admin users (modprobe option nvidia "
                 "NVreg_RestrictProfilingToAdminUsers=0, then reload the driver), or run with CAP_SYS_ADMIN "
                 "(docker --cap-add SYS_ADMIN)";
    case kMultipleSubscribers:
      return s + "; another profiler (Nsight Systems, DCGM profiling, a second tracer) owns CUPTI: stop it, "
                 "or set STEPSCOPE_GPU=metrics";
    case kNotCompatible:
      return s + "; the CUPTI library does not match the CUDA driver: use the libcupti of the CUDA version torch "
                 "was built with";
    default:
      return s;
  }
}

// Caller holds g_ctl_mu.
CUptiResult enable_all(std::string* what) {
  CUptiResult r = g_api.register_callbacks(buffer_requested, buffer_completed);
  if (r != kSuccess) {
    *what = "cuptiActivityRegisterCallbacks";
    return r;
  }
  for (ActivityKind k : kEnabledKinds) {
    r = g_api.enable(k);
    if (r != kSuccess) {
      for (ActivityKind d : kEnabledKinds) g_api.disable(d);
      *what = "cuptiActivityEnable(" + std::to_string(k) + ")";
      return r;
    }
  }
  return kSuccess;
}

void disable_and_flush() {
  for (ActivityKind k : kEnabledKinds) g_api.disable(k);
  g_api.flush_all(kFlushForced);
}

void set_kinds(bool on) {
  for (ActivityKind k : kEnabledKinds) on ? g_api.enable(k) : g_api.disable(k);
}

// At a step start on the training thread: two switches per run, no flush (CUPTI
// hands over the buffers on its own schedule, and at stop).
void on_step(uint32_t mode, int32_t step) {
  if (mode != g_train_mode) return;
  const bool want = step >= g_first_step && step <= g_last_step;
  std::lock_guard<std::mutex> lk(g_ctl_mu);
  if (g_active && !g_paused && want == g_step_off) set_kinds(want);
  g_step_off = !want;
}

}  // namespace

CuptiStart cupti_start(const std::string& library) {
  std::lock_guard<std::mutex> lk(g_ctl_mu);
  CuptiStart out;
  if (g_active) {
    out.ok = true;
    return out;
  }
  const bool driver = driver_present();
  std::string err = load(library);
  if (!err.empty()) {
    out.message = err;
    out.no_device = !driver;
    return out;
  }
  // Timestamps: CUPTI stamps records with our own clock where it can (CUPTI 12.4+);
  // otherwise its clock is mapped to ours by an offset read at start.
  g_clock_callback = g_api.register_timestamp && g_api.register_timestamp(mono_timestamp) == kSuccess;
  std::string what;
  CUptiResult r = enable_all(&what);
  if (r != kSuccess) {
    out.no_device = !driver || r == kNotInitialized;
    out.message = explain(r, what) + (driver ? "" : " (no CUDA driver: libcuda.so.1 not found)");
    return out;
  }
  g_offset_ns = g_clock_callback ? 0 : measure_offset();
  g_paused = false;
  g_active = true;
  out.ok = true;
  return out;
}

void cupti_stop() {
  std::lock_guard<std::mutex> lk(g_ctl_mu);
  g_step_hook = nullptr;
  if (!g_active) return;
  g_active = false;
  if (!g_paused) disable_and_flush();
  g_paused = false;
  g_step_off = false;
}

bool cupti_pause() {
  std::lock_guard<std::mutex> lk(g_ctl_mu);
  if (!g_active || g_paused) return false;
  disable_and_flush();
  {
    // Names are cached by CUPTI's string pointers, which the other profiler's
    // teardown may free and reuse: start the cache afresh after it.
    std::lock_guard<std::mutex> dk(g_decode_mu);
    g_kernel_names.clear();
  }
  g_paused = true;
  return true;
}

std::string cupti_resume() {
  std::lock_guard<std::mutex> lk(g_ctl_mu);
  if (!g_active || !g_paused) return {};
  g_paused = false;
  // Kineto may have finalized CUPTI (its teardown), which drops our timestamp
  // callback with everything else: the next call re-initializes CUPTI, and the
  // callback must be registered again or records come stamped in CUPTI's clock.
  g_clock_callback = g_api.register_timestamp && g_api.register_timestamp(mono_timestamp) == kSuccess;
  std::string what;
  CUptiResult r = enable_all(&what);
  if (r != kSuccess) {
    g_active = false;
    return explain(r, what);
  }
  g_offset_ns = g_clock_callback ? 0 : measure_offset();
  if (g_step_off) set_kinds(false);
  return {};
}

bool cupti_active() { return g_active.load() && !g_paused && !g_step_off; }

void cupti_set_steps(int32_t first, int32_t last, uint32_t train_mode) {
  std::lock_guard<std::mutex> lk(g_ctl_mu);
  g_first_step = first;
  g_last_step = last;
  g_train_mode = train_mode;
  // Steps count from 0: before the first one, collection waits for step `first`.
  const bool off = first > 0;
  if (g_active && !g_paused && off != g_step_off) set_kinds(!off);
  g_step_off = off;
  g_step_hook = on_step;
}
std::string cupti_clock_mapping() { return g_clock_callback ? "callback" : "offset"; }
uint64_t cupti_dropped() { return g_cupti_dropped.load(); }

void cupti_after_fork_child() {
  // CUPTI does not follow a fork: the child records no GPU activity of its own.
  new (&g_ctl_mu) std::mutex();
  new (&g_decode_mu) std::mutex();
  g_active = false;
  g_paused = false;
  g_step_off = false;
  g_step_hook = nullptr;
}

}  // namespace stepscope
