// Kernels aggregated per step and per (step, phase) in one pass (kernel_steps.h),
// following kernel_steps.py's ``_steps`` figure by figure.
#include "aggregate/kernel_steps.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace stepscope {
namespace aggregate {
namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();  // -1 codes sort last

struct Key {
  int64_t process, device, mode, step, phase;
  bool operator==(const Key& o) const {
    return process == o.process && device == o.device && mode == o.mode && step == o.step && phase == o.phase;
  }
  bool operator<(const Key& o) const {
    if (process != o.process) return process < o.process;
    if (device != o.device) return device < o.device;
    if (mode != o.mode) return mode < o.mode;
    if (step != o.step) return step < o.step;
    return phase < o.phase;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : {k.process, k.device, k.mode, k.step, k.phase}) h = (h ^ uint64_t(v)) * 1099511628211ull;
    return size_t(h);
  }
};

double median(std::vector<double>& v) {  // of the values given (NaN left out before); NaN when none
  if (v.empty()) return NAN;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + long(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2) return hi;
  return (*std::max_element(v.begin(), v.begin() + long(mid)) + hi) / 2;
}

// Per-row figures of the kernels (``_steps``' arrays before its group-by).
struct Rows {
  std::vector<int64_t> busy, gap;
  std::vector<uint8_t> waited;
};

Rows per_row(const KernelColumns& k, double max_gap_ns, int64_t slack) {
  Rows r;
  r.busy.resize(k.n), r.gap.resize(k.n), r.waited.resize(k.n);
  int64_t reach = 0;
  for (size_t i = 0; i < k.n; ++i) {
    const bool same = i > 0 && k.process[i] == k.process[i - 1] && k.device[i] == k.device[i - 1];
    const int64_t prev_reach = same ? reach : std::numeric_limits<int64_t>::min();  // furthest end before
    reach = same ? std::max(reach, k.end[i]) : k.end[i];
    r.busy[i] = std::max<int64_t>(k.end[i] - std::max(k.start[i], prev_reach), 0);
    const bool has_prev = same && k.step[i] == k.step[i - 1];
    r.gap[i] = has_prev ? std::max<int64_t>(k.start[i] - prev_reach, 0) : 0;
    r.waited[i] = has_prev && k.launched[i] >= double(prev_reach - slack) && r.gap[i] > 0 &&
                  double(r.gap[i]) < max_gap_ns;
  }
  return r;
}

void aggregate(const KernelColumns& k, const Rows& r, bool by_phase, KernelGroups& out) {
  std::unordered_map<Key, size_t, KeyHash> ids;
  std::vector<Key> keys;
  std::vector<size_t> group(k.n);
  Key last{};
  size_t last_id = SIZE_MAX;
  for (size_t i = 0; i < k.n; ++i) {
    Key key{k.process[i], k.device[i], k.mode[i] < 0 ? kNone : k.mode[i], k.step[i],
            by_phase ? (k.phase[i] < 0 ? kNone : k.phase[i]) : 0};
    if (last_id == SIZE_MAX || !(key == last)) {  // a step's kernels mostly come together: a lookup per run of them
      auto [it, added] = ids.emplace(key, keys.size());
      if (added) keys.push_back(key);
      last = key, last_id = it->second;
    }
    group[i] = last_id;
  }
  std::vector<size_t> order(keys.size());  // groups in sorted key order
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  std::vector<size_t> rank(keys.size());
  for (size_t g = 0; g < order.size(); ++g) rank[order[g]] = g;
  const size_t n = keys.size();
  for (auto* v : {&out.kernels, &out.kernel_ns, &out.busy_ns, &out.gap_ns, &out.launch_gaps, &out.launch_gap_ns})
    v->assign(n, 0);
  for (size_t i = 0; i < k.n; ++i) {
    const size_t g = rank[group[i]];
    out.kernels[g] += 1;
    out.kernel_ns[g] += k.duration[i];
    out.busy_ns[g] += r.busy[i];
    out.gap_ns[g] += r.gap[i];
    out.launch_gaps[g] += r.waited[i];
    out.launch_gap_ns[g] += r.waited[i] ? r.gap[i] : 0;
  }
  for (size_t g = 0; g < n; ++g) {
    const Key& key = keys[order[g]];
    out.process.push_back(key.process);
    out.device.push_back(key.device);
    out.mode.push_back(key.mode == kNone ? -1 : key.mode);
    out.step.push_back(key.step);
    if (by_phase) out.phase.push_back(key.phase == kNone ? -1 : key.phase);
  }
  if (by_phase) return;
  // medians: the rows grouped (a counting sort by group), then each group's values
  std::vector<size_t> first(n + 1, 0);
  for (size_t i = 0; i < k.n; ++i) ++first[rank[group[i]] + 1];
  std::partial_sum(first.begin(), first.end(), first.begin());
  std::vector<size_t> at(first.begin(), first.end() - 1), rows(k.n);
  for (size_t i = 0; i < k.n; ++i) rows[at[rank[group[i]]]++] = i;
  out.kernel_ns_median.resize(n), out.launch_gap_ns_median.resize(n), out.launch_latency_ns_median.resize(n);
  std::vector<double> v;
  for (size_t g = 0; g < n; ++g) {
    auto each = [&](auto value) {
      v.clear();
      for (size_t j = first[g]; j < first[g + 1]; ++j) {
        const double x = value(rows[j]);
        if (!std::isnan(x)) v.push_back(x);
      }
      return median(v);
    };
    out.kernel_ns_median[g] = each([&](size_t i) { return double(k.duration[i]); });
    out.launch_gap_ns_median[g] = each([&](size_t i) { return r.waited[i] ? double(r.gap[i]) : NAN; });
    out.launch_latency_ns_median[g] = each([&](size_t i) { return k.latency[i]; });
  }
}

}  // namespace

KernelAggregates kernel_steps(const KernelColumns& k, double max_gap_ns, int64_t launch_slack_ns) {
  KernelAggregates out;
  const Rows r = per_row(k, max_gap_ns, launch_slack_ns);
  aggregate(k, r, false, out.steps);
  aggregate(k, r, true, out.phases);
  return out;
}

}  // namespace aggregate
}  // namespace stepscope
