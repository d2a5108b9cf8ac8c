// The compute kernels of one or more devices aggregated per step and per (step,
// phase): counts, summed and median durations, busy time (the union of the kernels),
// idle gaps between kernels of a step and those that waited for a launch, the median
// launch gap and launch latency.
//
// The definition is analysis/tables/kernel_steps.py (``_steps``), whose Python stays
// the reference: tests/test_kernel_pass.py compares the two on random kernel tables
// and on the GPU fixtures.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace stepscope {
namespace aggregate {

// Kernels in (process, device, start) order, as columns; mode and phase are codes
// (-1: none), launched and latency NaN where unknown.
struct KernelColumns {
  size_t n = 0;
  const int64_t *process = nullptr, *device = nullptr, *start = nullptr, *end = nullptr, *step = nullptr;
  const int64_t *mode = nullptr, *phase = nullptr, *duration = nullptr;
  const double *launched = nullptr, *latency = nullptr;
};

// One row per group, in the order of a sorted group-by on (process, device, mode, step
// [, phase]) with "none" (-1) sorting last.
struct KernelGroups {
  std::vector<int64_t> process, device, mode, step, phase;  // phase: the per-phase table only
  std::vector<int64_t> kernels, kernel_ns, busy_ns, gap_ns, launch_gaps, launch_gap_ns;
  std::vector<double> kernel_ns_median, launch_gap_ns_median, launch_latency_ns_median;  // per step only
};

struct KernelAggregates {
  KernelGroups steps, phases;
};

KernelAggregates kernel_steps(const KernelColumns& k, double max_gap_ns, int64_t launch_slack_ns);

}  // namespace aggregate
}  // namespace stepscope
