// The writer's state that its files share (chunks.cc, names.cc, step_marks.cc,
// writer.cc): the chunk pool and thread registry, the name table, the writer thread's state.
#pragma once
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "record/recorder.h"

namespace stepscope {

// The chunk pool and the thread registry: everything guarded by g_mu.
extern std::mutex g_mu;
extern ThreadState* g_threads;
extern Chunk* g_free;
extern Chunk* g_full_head;
extern Chunk* g_full_tail;
extern size_t g_full_count;
extern size_t g_chunks_total;
extern size_t g_chunks_max;

inline void free_chunk_locked(Chunk* c) {
  c->committed.store(0, std::memory_order_relaxed);
  c->flushed = 0;
  c->next = g_free;
  g_free = c;
}

inline void enqueue_full_locked(Chunk* c) {
  c->next = nullptr;
  if (g_full_tail) g_full_tail->next = c; else g_full_head = c;
  g_full_tail = c;
  ++g_full_count;
}

// The name table (names.cc), guarded by g_names_mu.
extern std::mutex g_names_mu;
extern std::vector<std::string> g_names;
extern std::atomic<uint64_t> g_names_folded;  // lookups folded since the trace opened

// Step numbers start again from 0 in every trace (step_marks.cc).
void reset_steps();

// Writer state: touched only by the writer thread and by open/close, which
// never run while the writer thread does (but `urgent` and `wake`: rotate_chunk).
struct Writer {
  int fd = -1;
  std::string path;
  int flush_ms = 1000;
  std::thread thread;
  std::mutex wake_mu;
  std::condition_variable wake;
  bool stop = false;
  std::atomic<bool> urgent{false};
  size_t names_written = 0;
  uint64_t floor_bytes = 0;  // free space kept for the job on the trace's file system
  double floor_fraction = 0;
  std::atomic<uint64_t> written{0};
  std::atomic<uint64_t> bytes{0};
  std::string error;
  std::string buf;
  bool opening = false;  // open_writer returns its error: the caller reports it
};
extern Writer g_w;
extern TickConverter g_conv;  // ticks to nanoseconds, an anchor more every flush

// The chunks a flush writes (encode.cc).
void encode_events(std::string& out, uint64_t track, const Record* r, uint32_t n);
void encode_track(std::string& out, const ThreadState& ts);
void encode_names(std::string& out);
void encode_stats(std::string& out, uint8_t type);

}  // namespace stepscope
