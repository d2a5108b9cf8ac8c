// Step marks: each thread's open step, numbered per mode, recorded as step-category instants.
#include "record/buffers.h"

namespace stepscope {
namespace {

// The open step's mode, per thread: each thread's training loop has its own
// steps (SPEC §3). A session restart bumps the generation: stale values read as closed.
std::atomic<uint32_t> g_steps_generation{0};
// (initial-exec: read at every step's start, as tls_state is at every record)
thread_local int32_t tls_open_mode __attribute__((tls_model("initial-exec"))) = -1;
thread_local uint32_t tls_open_generation __attribute__((tls_model("initial-exec"))) = 0;
thread_local int32_t tls_open_number __attribute__((tls_model("initial-exec"))) = -1;  // its number

}  // namespace

// Step numbers count per mode, from 0 in every session.
std::mutex g_steps_mu;
std::unordered_map<uint32_t, int32_t> g_next_step_by_mode;

void reset_steps() {
  std::lock_guard<std::mutex> lk(g_steps_mu);
  g_next_step_by_mode.clear();
  g_step.store(-1);
  g_steps_generation.fetch_add(1);
}

std::atomic<StepHook> g_step_hook{nullptr};

int32_t begin_step(uint32_t mode_name, uint64_t at) {
  int32_t n;
  {
    std::lock_guard<std::mutex> lk(g_steps_mu);
    n = g_next_step_by_mode[mode_name]++;
  }
  g_step.store(n, std::memory_order_relaxed);
  tls_open_mode = int32_t(mode_name);
  tls_open_number = n;
  tls_open_generation = g_steps_generation.load(std::memory_order_relaxed);
  record_instant_at(kCatStep, mode_name, at ? at : ticks(), uint64_t(n), true);
  if (StepHook hook = g_step_hook.load(std::memory_order_relaxed)) hook(mode_name, n);
  return n;
}

void end_step(uint64_t at) {
  if (tls_open_mode < 0 || tls_open_generation != g_steps_generation.load(std::memory_order_relaxed)) return;
  static const uint32_t end_name = intern("end");
  record_instant_at(kCatStep, end_name, at ? at : ticks(), 0, false);
  tls_open_mode = -1;
  g_step.store(-1, std::memory_order_relaxed);
}

bool interrupt_step(uint64_t at) {
  if (tls_open_mode < 0 || tls_open_generation != g_steps_generation.load(std::memory_order_relaxed)) return false;
  static const uint32_t interrupted_name = intern("interrupted");
  record_instant_at(kCatStep, interrupted_name, at ? at : ticks(), uint64_t(tls_open_number), true);
  return true;
}

bool void_step(uint64_t at) {
  if (tls_open_mode < 0 || tls_open_generation != g_steps_generation.load(std::memory_order_relaxed)) return false;
  static const uint32_t void_name = intern("void");
  record_instant_at(kCatStep, void_name, at ? at : ticks(), uint64_t(tls_open_number), true);
  {
    std::lock_guard<std::mutex> lk(g_steps_mu);
    int32_t& next = g_next_step_by_mode[uint32_t(tls_open_mode)];
    if (next == tls_open_number + 1) next = tls_open_number;  // (no step of its mode began since)
  }
  tls_open_mode = -1;
  g_step.store(-1, std::memory_order_relaxed);
  return true;
}

void end_step_of_thread(uint64_t tid, uint64_t at) {
  static const uint32_t end_name = intern("end");
  record_instant_at(kCatStep, end_name, at ? at : ticks(), tid, true);
}

}  // namespace stepscope
