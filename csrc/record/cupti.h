// GPU activity tracing through CUPTI, loaded at run time (see cupti.cc).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace stepscope {

struct CuptiStart {
  bool ok = false;
  bool no_device = false;  // no CUDA driver/device: a note, not a warning
  std::string message;     // why it is not tracing, with the fix when there is one
};

// Loads libcupti from `library` (a path or a soname), registers the buffer
// callbacks and enables kernel, memcpy, memset, synchronisation, runtime and
// driver API activity.
CuptiStart cupti_start(const std::string& library);
// Disables collection and flushes every pending buffer into the GPU queue.
void cupti_stop();
// Another owner (torch.profiler) takes CUPTI: flush and stand aside; resume after.
bool cupti_pause();
std::string cupti_resume();
bool cupti_active();
// STEPSCOPE_STEPS: trace only train steps first..last (inclusive); collection is off before and after.
void cupti_set_steps(int32_t first, int32_t last, uint32_t train_mode);
std::string cupti_clock_mapping();  // "callback" or "offset"
uint64_t cupti_dropped();
void cupti_after_fork_child();
// Byte offsets of the record fields read, for a test against CUPTI's headers.
std::vector<std::pair<std::string, uint32_t>> cupti_layout();

}  // namespace stepscope
