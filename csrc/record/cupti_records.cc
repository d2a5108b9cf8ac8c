// CUPTI's activity buffers: handed out to CUPTI, and decoded natively when it hands
// them back (kernels, copies, sets, waits, API calls) into the GPU queue (gpu.h).
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "record/cupti.h"
#include "record/cupti_abi.h"
#include "record/gpu.h"
#include "record/recorder.h"

namespace stepscope {
namespace cupti {

int64_t g_offset_ns = 0;
std::atomic<uint64_t> g_cupti_dropped{0};
// Decoder state, touched from CUPTI's completion callbacks (one at a time).
std::mutex g_decode_mu;
std::unordered_map<const char*, uint32_t> g_kernel_names;
std::unordered_map<uint64_t, int64_t> g_api_names;          // (domain << 32 | cbid) -> name id, -1: skipped
std::unordered_map<uint32_t, uint32_t> g_context_device;

namespace {

std::atomic<int> g_buffers_out{0};
constexpr size_t kBufferBytes = 4u << 20;
constexpr int kMaxBuffersOut = 64;  // 256 MiB of unprocessed activity: CUPTI drops (and counts) beyond

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
}  // namespace

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
}  // namespace cupti

using namespace cupti;

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
