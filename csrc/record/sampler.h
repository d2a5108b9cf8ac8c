// The native system sampler (see sampler.cc).
#pragma once
#include <string>
#include <vector>

namespace stepscope {

// Starts sampling every interval_ms: node=true for the host-wide metrics,
// processes=true for this process and its children. Returns notes on what
// cannot be measured here (missing or unreadable files).
std::vector<std::string> start_sampler(int interval_ms, bool node, bool processes);
void stop_sampler();
void sampler_after_fork_child();
double sampler_pass_ns(int passes);
// The /proc tree the next start reads (STEPSCOPE_PROC_ROOT; empty: /proc).
void set_proc_root(const std::string& root);

}  // namespace stepscope
