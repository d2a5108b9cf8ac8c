// CUPTI's ABI as plain numbers and byte offsets (see cupti.cc's opening comment), the
// entry points cupti.cc loads, and what its control (cupti.cc) and its activity-buffer
// decoding (cupti_records.cc) share.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace stepscope {
namespace cupti {

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
  CUptiResult (*callback_name)(int, uint32_t, const char**) = nullptr;};
extern Api g_api;

// Shared by the control and the decoder.
extern int64_t g_offset_ns;  // added to CUPTI times when no timestamp callback is in place
extern std::atomic<uint64_t> g_cupti_dropped;
extern std::mutex g_decode_mu;  // the decoder's state, touched from CUPTI's completion callbacks
extern std::unordered_map<const char*, uint32_t> g_kernel_names;  // CUPTI keeps name strings alive
// CUPTI's buffer callbacks (cupti_records.cc): hand out a buffer, decode a full one into the GPU queue.
void buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records);
void buffer_completed(void* context, uint32_t stream, uint8_t* buffer, size_t, size_t valid);

}  // namespace cupti
}  // namespace stepscope
