// The recording threads' side of the buffers: the hot path's globals, the thread
// registry and the bounded chunk pool (recorder.h's push() fills the chunks).
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <new>

#include "record/buffers.h"

namespace stepscope {

std::atomic<bool> g_enabled{false};
std::atomic<int32_t> g_step{-1};
uint32_t g_generation = 1;
std::atomic<uint64_t> g_dropped{0};
thread_local ThreadState* tls_state __attribute__((tls_model("initial-exec"))) = nullptr;

// Everything below is guarded by g_mu unless noted.
std::mutex g_mu;
ThreadState* g_threads = nullptr;
Chunk* g_free = nullptr;
Chunk* g_full_head = nullptr;
Chunk* g_full_tail = nullptr;
size_t g_full_count = 0;
size_t g_chunks_total = 0;
size_t g_chunks_max = 64;

namespace {

// Runs at thread exit: hand in the partial chunk so the writer flushes it.
struct ThreadExit {
  ~ThreadExit() {
    ThreadState* ts = tls_state;
    if (!ts) return;
    tls_state = nullptr;
    std::lock_guard<std::mutex> lk(g_mu);
    if (ts->generation != g_generation) return;  // inherited across fork: already gone
    if (ts->cur) enqueue_full_locked(ts->cur);
    ts->cur = nullptr;
    for (ThreadState** p = &g_threads; *p; p = &(*p)->next) {
      if (*p == ts) { *p = ts->next; break; }
    }
    delete ts;
  }
};
thread_local ThreadExit tls_exit;

}  // namespace

ThreadState* register_thread() {
  (void)&tls_exit;  // touch to arm the thread-exit destructor
  auto* ts = new ThreadState();
  ts->tid = uint64_t(syscall(SYS_gettid));
  char name[64] = {0};
  if (pthread_getname_np(pthread_self(), name, sizeof name) == 0) ts->name = name;
  std::lock_guard<std::mutex> lk(g_mu);
  ts->generation = g_generation;
  ts->next = g_threads;
  g_threads = ts;
  tls_state = ts;
  return ts;
}

Chunk* rotate_chunk(ThreadState* ts) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (ts->cur) {
    enqueue_full_locked(ts->cur);
    ts->cur = nullptr;
  }
  Chunk* c = g_free;
  if (c) {
    g_free = c->next;
  } else if (g_chunks_total < g_chunks_max) {
    c = new (std::nothrow) Chunk();
    if (c) ++g_chunks_total;
  }
  if (g_full_count * 2 >= g_chunks_max) {
    g_w.urgent = true;
    g_w.wake.notify_one();
  }
  if (!c) return nullptr;
  c->next = nullptr;
  c->track = ts->tid;
  ts->cur = c;
  return c;
}

void record_counter(uint8_t cat, uint32_t name, double value, uint64_t arg, bool has_arg, uint64_t at) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  uint64_t bits;
  std::memcpy(&bits, &value, 8);
  push(kCounter, cat, name, at ? at : ticks(), bits, arg, has_arg ? kHasArg : 0);
}

}  // namespace stepscope
