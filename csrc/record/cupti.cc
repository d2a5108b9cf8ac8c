// CUPTI activity tracing, with neither CUDA headers nor a link-time
// dependency: libcupti is dlopen'ed at run time (the copy torch loads, found by
// the Python side), its buffers are decoded here, natively, and the records go
// through the GPU queue into the trace (gpu.h). A dense kernel stream produces
// hundreds of thousands of records a second: no Python runs on this path.
//
// The few CUPTI types used are declared below as plain numbers and byte
// offsets. They are facts of CUPTI's ABI, read from CUPTI 13.0's
// cupti_activity.h (CUPTI_API_VERSION 130001): CUpti_ActivityKernel10,
// CUpti_ActivityMemcpy6, CUpti_ActivityMemcpyPtoP4, CUpti_ActivityMemset4,
// CUpti_ActivitySynchronization2, CUpti_ActivityAPI. Only fields of the
// records' long-stable prefixes are read (the kernel's up to `name` is
// unchanged since CUpti_ActivityKernel4, so CUPTI 12.x delivers the same
// offsets); tests/test_gpu.py checks them against the headers where a CUDA
// toolkit is installed.
#include "record/cupti.h"

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
namespace {

// ---- CUPTI ABI (numbers from cupti_result.h / cupti_activity.h, CUPTI 13.0)
using CUptiResult = int;
constexpr CUptiResult kSuccess = 0, kMaxLimitReached = 12, kNotInitialized = 15, kNotCompatible = 14,
                      kInsufficientPrivileges = 35, kMultipleSubscribers = 39, kVirtInsufficientPrivileges = 40;
enum ActivityKind : uint32_t {
  kMemcpy = 1, kMemset = 2, kDriver = 4, kRuntime = 5, kConcurrentKernel = 10, kMemcpyPeer = 22,
  kSynchronization = 38,
};
constexpr ActivityKind kEnabledKinds[] = {kConcurrentKernel, kMemcpy, kMemcpyPeer, kMemset,
                                          kSynchronization, kRuntime, kDriver};
constexpr int kDomainDriver = 1, kDomainRuntime = 2;  // CUpti_CallbackDomain
constexpr uint32_t kFlushForced = 1;                  // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED

namespace kernel {  // CUpti_ActivityKernel4..10
constexpr uint32_t registers = 6, start = 16, end = 24, device = 40, context = 44, stream = 48, grid = 52,
                   block = 64, static_smem = 76, dynamic_smem = 80, correlation = 92, name = 104;
}
namespace memcpy_ {  // CUpti_ActivityMemcpy5/6
constexpr uint32_t copy_kind = 4, src_kind = 5, dst_kind = 6, bytes = 8, start = 16, end = 24, device = 32,
                   context = 36, stream = 40, correlation = 44;
}
namespace peer {  // CUpti_ActivityMemcpyPtoP3/4
constexpr uint32_t correlation = 60;
}
namespace memset_ {  // CUpti_ActivityMemset3/4
constexpr uint32_t bytes = 8, start = 16, end = 24, device = 32, context = 36, stream = 40, correlation = 44,
                   memory_kind = 50;
}
namespace sync {  // CUpti_ActivitySynchronization(2)
constexpr uint32_t type = 4, start = 8, end = 16, correlation = 24, context = 28, stream = 32;
}
namespace api {  // CUpti_ActivityAPI
constexpr uint32_t cbid = 4, start = 8, end = 16, thread = 28, correlation = 32;
}

template <typename T>
T field(const uint8_t* rec, uint32_t offset) {
  T v;
  std::memcpy(&v, rec + offset, sizeof v);
  return v;
}

using BufferRequested = void (*)(uint8_t**, size_t*, size_t*);
using BufferCompleted = void (*)(void*, uint32_t, uint8_t*, size_t, size_t);
using TimestampFn = uint64_t (*)();

struct Api {
  void* lib = nullptr;
  CUptiResult (*register_callbacks)(BufferRequested, BufferCompleted) = nullptr;
  CUptiResult (*enable)(uint32_t) = nullptr;
  CUptiResult (*disable)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, uint8_t**) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*dropped)(void*, uint32_t, size_t*) = nullptr;
  CUptiResult (*get_timestamp)(uint64_t*) = nullptr;
  CUptiResult (*register_timestamp)(TimestampFn) = nullptr;  // CUPTI 12.4+; optional
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
  CUptiResult (*callback_name)(int, uint32_t, const char**) = nullptr;
} g_api;

std::mutex g_ctl_mu;  // start/stop/pause
std::atomic<bool> g_active{false};
bool g_paused = false;    // torch.profiler owns CUPTI
bool g_step_off = false;  // outside the STEPSCOPE_STEPS window
int32_t g_first_step = -1, g_last_step = -1;
uint32_t g_train_mode = 0;
bool g_clock_callback = false;
int64_t g_offset_ns = 0;  // added to CUPTI times when no timestamp callback is in place
std::atomic<uint64_t> g_cupti_dropped{0};
std::atomic<int> g_buffers_out{0};
constexpr size_t kBufferBytes = 4u << 20;
constexpr int kMaxBuffersOut = 64;  // 256 MiB of unprocessed activity: CUPTI drops (and counts) beyond

// Decoder state, touched from CUPTI's completion callbacks (one at a time).
std::mutex g_decode_mu;
std::unordered_map<const char*, uint32_t> g_kernel_names;  // CUPTI keeps name strings alive
std::unordered_map<uint64_t, int64_t> g_api_names;          // (domain << 32 | cbid) -> name id, -1: skipped
std::unordered_map<uint32_t, uint32_t> g_context_device;

std::string result_text(CUptiResult r) {
  const char* s = nullptr;
  if (g_api.result_string && g_api.result_string(r, &s) == kSuccess && s) return s;
  return "CUPTI error " + std::to_string(r);
}

uint64_t mono_timestamp() { return uint64_t(mono_ns()); }

// Only calls that launch, copy, set, wait or allocate are kept: the API also
// reports every cudaGetDevice and cudaGetLastError, many per kernel.
bool worth_keeping(const char* name) {
  static const char* const keys[] = {"Launch", "Memcpy", "Memset", "Synchronize", "WaitEvent", "EventRecord",
                                     "Malloc", "Free", "MemAlloc"};
  for (const char* k : keys)
    if (std::strstr(name, k)) return true;
  return false;
}

int64_t api_name(int domain, uint32_t cbid) {
  const uint64_t key = (uint64_t(domain) << 32) | cbid;
  auto it = g_api_names.find(key);
  if (it != g_api_names.end()) return it->second;
  const char* name = nullptr;
  int64_t id = -1;
  if (g_api.callback_name && g_api.callback_name(domain, cbid, &name) == kSuccess && name) {
    // Runtime names come versioned ("cudaLaunchKernel_v7000"): keep the function's name.
    std::string s(name);
    size_t v = s.find("_v");
    if (v != std::string::npos && v + 2 < s.size() && std::isdigit(uint8_t(s[v + 2]))) s.resize(v);
    if (worth_keeping(s.c_str())) id = intern(s);
  }
  g_api_names.emplace(key, id);
  return id;
}

uint32_t device_of_context(uint32_t context) {
  auto it = g_context_device.find(context);
  return it == g_context_device.end() ? 0 : it->second;
}

bool decode(const uint8_t* rec, GpuRecord& r) {
  const uint32_t kind = field<uint32_t>(rec, 0);
  std::memset(&r, 0, sizeof r);
  auto times = [&](uint32_t start, uint32_t end) {
    r.start_ns = uint64_t(int64_t(field<uint64_t>(rec, start)) + g_offset_ns);
    r.end_ns = uint64_t(int64_t(field<uint64_t>(rec, end)) + g_offset_ns);
  };
  switch (kind) {
    case kConcurrentKernel: {
      r.type = kGpuKernel;
      times(kernel::start, kernel::end);
      r.device = field<uint32_t>(rec, kernel::device);
      r.stream = field<uint32_t>(rec, kernel::stream);
      r.correlation = field<uint32_t>(rec, kernel::correlation);
      g_context_device[field<uint32_t>(rec, kernel::context)] = r.device;
      LaunchConfig c{};
      for (int i = 0; i < 3; ++i) {
        c.grid[i] = uint32_t(field<int32_t>(rec, kernel::grid + 4 * i));
        c.block[i] = uint32_t(field<int32_t>(rec, kernel::block + 4 * i));
      }
      c.registers = field<uint16_t>(rec, kernel::registers);
      c.static_smem = uint32_t(field<int32_t>(rec, kernel::static_smem));
      c.dynamic_smem = uint32_t(field<int32_t>(rec, kernel::dynamic_smem));
      r.config = intern_launch_config(c);
      const char* name = field<const char*>(rec, kernel::name);
      auto it = g_kernel_names.find(name);
      if (it == g_kernel_names.end()) it = g_kernel_names.emplace(name, intern(name ? name : "?")).first;
      r.name = it->second;
      return true;
    }
    case kMemcpy:
    case kMemcpyPeer:
      r.type = kGpuMemcpy;
      times(memcpy_::start, memcpy_::end);
      r.sub = field<uint8_t>(rec, memcpy_::copy_kind);
      r.sub2 = uint8_t((field<uint8_t>(rec, memcpy_::src_kind) & 15) | (field<uint8_t>(rec, memcpy_::dst_kind) << 4));
      r.bytes = field<uint64_t>(rec, memcpy_::bytes);
      r.device = field<uint32_t>(rec, memcpy_::device);
      r.stream = field<uint32_t>(rec, memcpy_::stream);
      r.correlation = field<uint32_t>(rec, kind == kMemcpy ? memcpy_::correlation : peer::correlation);
      g_context_device[field<uint32_t>(rec, memcpy_::context)] = r.device;
      return true;
    case kMemset:
      r.type = kGpuMemset;
      times(memset_::start, memset_::end);
      r.sub = uint8_t(field<uint16_t>(rec, memset_::memory_kind));
      r.bytes = field<uint64_t>(rec, memset_::bytes);
      r.device = field<uint32_t>(rec, memset_::device);
      r.stream = field<uint32_t>(rec, memset_::stream);
      r.correlation = field<uint32_t>(rec, memset_::correlation);
      g_context_device[field<uint32_t>(rec, memset_::context)] = r.device;
      return true;
    case kSynchronization:
      r.type = kGpuSync;
      times(sync::start, sync::end);
      r.sub = uint8_t(field<uint32_t>(rec, sync::type));
      r.device = device_of_context(field<uint32_t>(rec, sync::context));
      r.stream = field<uint32_t>(rec, sync::stream);  // 0xffffffff: a context-wide wait
      r.correlation = field<uint32_t>(rec, sync::correlation);
      return true;
    case kRuntime:
    case kDriver: {
      const int64_t name = api_name(kind == kRuntime ? kDomainRuntime : kDomainDriver,
                                    field<uint32_t>(rec, api::cbid));
      if (name < 0) return false;
      r.type = kind == kRuntime ? kGpuRuntime : kGpuDriver;
      times(api::start, api::end);
      r.name = uint32_t(name);
      r.thread = field<uint32_t>(rec, api::thread);
      r.correlation = field<uint32_t>(rec, api::correlation);
      return true;
    }
    default:
      return false;
  }
}

void buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *max_records = 0;
  *buffer = nullptr;
  *size = 0;
  if (g_buffers_out.load() >= kMaxBuffersOut) return;  // CUPTI drops and counts the records
  void* p = nullptr;
  if (posix_memalign(&p, 8, kBufferBytes) != 0) return;
  g_buffers_out.fetch_add(1);
  *buffer = static_cast<uint8_t*>(p);
  *size = kBufferBytes;
}

void buffer_completed(void* context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  if (buffer && valid > 0 && g_api.next_record) {
    std::vector<GpuRecord> out;
    out.reserve(valid / 64);
    {
      std::lock_guard<std::mutex> lk(g_decode_mu);
      uint8_t* rec = nullptr;
      GpuRecord r;
      while (g_api.next_record(buffer, valid, &rec) == kSuccess) {
        if (decode(rec, r)) out.push_back(r);
      }
    }
    // Records reaching a closed trace are simply not queued.
    if (!out.empty() && g_enabled.load()) gpu_enqueue(out.data(), out.size());
  }
  size_t dropped = 0;
  if (g_api.dropped && g_api.dropped(context, stream, &dropped) == kSuccess && dropped) {
    g_cupti_dropped.fetch_add(dropped);
    gpu_add_dropped(dropped);  // counted like every dropped event: STATS, process.json, load() warns
  }
  if (buffer) {
    std::free(buffer);
    g_buffers_out.fetch_sub(1);
  }
}

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

std::vector<std::pair<std::string, uint32_t>> cupti_layout() {
  return {{"CUpti_ActivityKernel10.registersPerThread", kernel::registers},
          {"CUpti_ActivityKernel10.start", kernel::start},
          {"CUpti_ActivityKernel10.end", kernel::end},
          {"CUpti_ActivityKernel10.deviceId", kernel::device},
          {"CUpti_ActivityKernel10.contextId", kernel::context},
          {"CUpti_ActivityKernel10.streamId", kernel::stream},
          {"CUpti_ActivityKernel10.gridX", kernel::grid},
          {"CUpti_ActivityKernel10.blockX", kernel::block},
          {"CUpti_ActivityKernel10.staticSharedMemory", kernel::static_smem},
          {"CUpti_ActivityKernel10.dynamicSharedMemory", kernel::dynamic_smem},
          {"CUpti_ActivityKernel10.correlationId", kernel::correlation},
          {"CUpti_ActivityKernel10.name", kernel::name},
          {"CUpti_ActivityMemcpy6.copyKind", memcpy_::copy_kind},
          {"CUpti_ActivityMemcpy6.srcKind", memcpy_::src_kind},
          {"CUpti_ActivityMemcpy6.dstKind", memcpy_::dst_kind},
          {"CUpti_ActivityMemcpy6.bytes", memcpy_::bytes},
          {"CUpti_ActivityMemcpy6.start", memcpy_::start},
          {"CUpti_ActivityMemcpy6.end", memcpy_::end},
          {"CUpti_ActivityMemcpy6.deviceId", memcpy_::device},
          {"CUpti_ActivityMemcpy6.contextId", memcpy_::context},
          {"CUpti_ActivityMemcpy6.streamId", memcpy_::stream},
          {"CUpti_ActivityMemcpy6.correlationId", memcpy_::correlation},
          {"CUpti_ActivityMemcpyPtoP4.copyKind", memcpy_::copy_kind},
          {"CUpti_ActivityMemcpyPtoP4.bytes", memcpy_::bytes},
          {"CUpti_ActivityMemcpyPtoP4.start", memcpy_::start},
          {"CUpti_ActivityMemcpyPtoP4.deviceId", memcpy_::device},
          {"CUpti_ActivityMemcpyPtoP4.contextId", memcpy_::context},
          {"CUpti_ActivityMemcpyPtoP4.streamId", memcpy_::stream},
          {"CUpti_ActivityMemcpyPtoP4.correlationId", peer::correlation},
          {"CUpti_ActivityMemset4.bytes", memset_::bytes},
          {"CUpti_ActivityMemset4.start", memset_::start},
          {"CUpti_ActivityMemset4.end", memset_::end},
          {"CUpti_ActivityMemset4.deviceId", memset_::device},
          {"CUpti_ActivityMemset4.contextId", memset_::context},
          {"CUpti_ActivityMemset4.streamId", memset_::stream},
          {"CUpti_ActivityMemset4.correlationId", memset_::correlation},
          {"CUpti_ActivityMemset4.memoryKind", memset_::memory_kind},
          {"CUpti_ActivitySynchronization2.type", sync::type},
          {"CUpti_ActivitySynchronization2.start", sync::start},
          {"CUpti_ActivitySynchronization2.end", sync::end},
          {"CUpti_ActivitySynchronization2.correlationId", sync::correlation},
          {"CUpti_ActivitySynchronization2.contextId", sync::context},
          {"CUpti_ActivitySynchronization2.streamId", sync::stream},
          {"CUpti_ActivityAPI.cbid", api::cbid},
          {"CUpti_ActivityAPI.start", api::start},
          {"CUpti_ActivityAPI.end", api::end},
          {"CUpti_ActivityAPI.threadId", api::thread},
          {"CUpti_ActivityAPI.correlationId", api::correlation}};
}

}  // namespace stepscope
