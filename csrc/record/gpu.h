// GPU activity: records of what a device ran (kernels, copies, memsets,
// synchronisations) and the CUDA API calls that launched them. They arrive in
// bulk and late (CUPTI hands over full buffers), with nanosecond times on the
// run's clock (CLOCK_MONOTONIC), so they take their own path to disk: a
// bounded queue the writer drains at every flush into GPU chunks, one per
// device stream (docs/format.md). CUPTI's decoder (cupti.cc) and Python's
// `_native.gpu_record` (tests, fixtures) both write through `gpu_enqueue`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace stepscope {

enum GpuType : uint8_t {
  kGpuKernel = 0,
  kGpuMemcpy = 1,   // sub: copy kind; sub2: src memory kind | dst memory kind << 4
  kGpuMemset = 2,   // sub: memory kind
  kGpuSync = 3,     // sub: synchronisation type; stream 0xffffffff = context-wide
  kGpuRuntime = 4,  // CUDA runtime API call (host side); thread = CUPTI's thread id
  kGpuDriver = 5,   // CUDA driver API call (host side)
  kNumGpuTypes = 6,
};

// Copy kinds, memory kinds and synchronisation types use CUPTI's numbering
// (CUpti_ActivityMemcpyKind, CUpti_ActivityMemoryKind,
// CUpti_ActivitySynchronizationType: stable since CUPTI 10).

struct LaunchConfig {
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t registers;
  uint32_t static_smem;
  uint32_t dynamic_smem;
  bool operator==(const LaunchConfig& o) const;
};

struct GpuRecord {
  uint64_t start_ns;  // CLOCK_MONOTONIC ns
  uint64_t end_ns;
  uint64_t bytes;     // memcpy / memset bytes
  uint32_t device;
  uint32_t stream;    // device records; 0 for API calls
  uint32_t name;      // interned: kernel name (mangled) or API function name
  uint32_t config;    // launch config id (kernels)
  uint32_t correlation;
  uint32_t thread;    // API calls: the calling thread as CUPTI reports it
  uint8_t type;
  uint8_t sub;
  uint8_t sub2;
};

constexpr uint32_t kApiStream = 0xffffffffu;  // the track of a process's API calls

uint32_t intern_launch_config(const LaunchConfig& c);
// Queues records for the next flush; returns how many were dropped (queue full).
size_t gpu_enqueue(const GpuRecord* r, size_t n);

// Writer side: new launch configs and one chunk per track since the last call.
void encode_gpu(std::string& out);
// A new trace: configs and tracks described again, queue emptied. after_fork:
// the child has only the forking thread, and the lock may have been held.
void reset_gpu_state(bool after_fork);
uint64_t gpu_written();
void gpu_add_dropped(uint64_t n);  // records CUPTI itself dropped (its buffers ran out)
uint64_t gpu_dropped();

}  // namespace stepscope
