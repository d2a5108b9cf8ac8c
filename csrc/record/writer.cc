// Thread registry, chunk pool, interned names and the background writer.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "record/cupti.h"
#include "common/encoding.h"
#include "record/gpu.h"
#include "record/pysampler.h"
#include "record/recorder.h"
#include "record/sampler.h"

namespace stepscope {

std::atomic<bool> g_enabled{false};
std::atomic<int32_t> g_step{-1};
uint32_t g_generation = 1;
std::atomic<uint64_t> g_dropped{0};
thread_local ThreadState* tls_state __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

// Everything below is guarded by g_mu unless noted.
std::mutex g_mu;
ThreadState* g_threads = nullptr;
Chunk* g_free = nullptr;
Chunk* g_full_head = nullptr;
Chunk* g_full_tail = nullptr;
size_t g_full_count = 0;
size_t g_chunks_total = 0;
size_t g_chunks_max = 64;

std::mutex g_names_mu;
std::vector<std::string> g_names;
std::unordered_map<std::string, uint32_t> g_name_ids;
size_t g_name_bytes = 0;                       // the text held in g_names
std::atomic<uint64_t> g_names_count{0};        // g_names.size(), read without the lock
uint32_t g_overflow_id = UINT32_MAX;           // kOverflowName's id, once a name was folded
std::atomic<uint64_t> g_names_folded{0};      // lookups folded since the trace opened

// The open step's mode, per thread: each thread's training loop has its own
// steps (SPEC §3). A session restart bumps the generation: stale values read as closed.
std::atomic<uint32_t> g_steps_generation{0};
// (initial-exec: read at every step's start, as tls_state is at every record)
thread_local int32_t tls_open_mode __attribute__((tls_model("initial-exec"))) = -1;
thread_local uint32_t tls_open_generation __attribute__((tls_model("initial-exec"))) = 0;
thread_local int32_t tls_open_number __attribute__((tls_model("initial-exec"))) = -1;  // its number

TickConverter g_conv;

// Writer state: touched only by the writer thread and by open/close, which
// never run while the writer thread does.
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
} g_w;

std::atomic<bool> g_failed{false};

void free_chunk_locked(Chunk* c) {
  c->committed.store(0, std::memory_order_relaxed);
  c->flushed = 0;
  c->next = g_free;
  g_free = c;
}

void enqueue_full_locked(Chunk* c) {
  c->next = nullptr;
  if (g_full_tail) g_full_tail->next = c; else g_full_head = c;
  g_full_tail = c;
  ++g_full_count;
}

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

// The table lives as long as the process (ids stay valid across sessions), so it
// is bounded: past kMaxNames names or kMaxNameBytes of text, a new name is
// recorded as kOverflowName and counted, and memory stays flat whatever a
// program names (a name per item, per request, per generated op).
uint32_t intern(const std::string& s, bool* folded) {
  std::lock_guard<std::mutex> lk(g_names_mu);
  auto it = g_name_ids.find(s);
  if (it != g_name_ids.end()) {
    if (folded) *folded = false;
    return it->second;
  }
  const bool full = g_names.size() + 1 >= kMaxNames || g_name_bytes + s.size() > kMaxNameBytes;
  if (full) {
    if (g_overflow_id == UINT32_MAX) {  // the slot kept for it
      g_overflow_id = uint32_t(g_names.size());
      g_names.emplace_back(kOverflowName);
      g_name_ids.emplace(kOverflowName, g_overflow_id);
      g_names_count.store(g_names.size(), std::memory_order_release);
    }
    g_names_folded.fetch_add(1, std::memory_order_relaxed);
    if (folded) *folded = true;
    return g_overflow_id;
  }
  if (folded) *folded = false;
  uint32_t id = uint32_t(g_names.size());
  g_names.push_back(s);
  g_name_bytes += s.size();
  g_name_ids.emplace(s, id);
  g_names_count.store(g_names.size(), std::memory_order_release);
  return id;
}

// Ids are dense from 0: one compare, no lock (the entry points that take an id check it).
bool is_interned(uint64_t id) { return id < g_names_count.load(std::memory_order_acquire); }

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

void end_step_of_thread(uint64_t tid, uint64_t at) {
  static const uint32_t end_name = intern("end");
  record_instant_at(kCatStep, end_name, at ? at : ticks(), tid, true);
}

// ---------------------------------------------------------------- writer

namespace {

void begin_chunk(std::string& out, uint8_t type, size_t* at) {
  *at = out.size();
  out.append(kChunkHeader, '\0');
  (void)type;
}

void end_chunk(std::string& out, uint8_t type, size_t at) {
  const uint32_t len = uint32_t(out.size() - at - kChunkHeader);
  write_chunk_header(&out[at], type, out.data() + at + kChunkHeader, len);
}

// Events chunk: track | count | base_ns | base_step | records. Each record:
// byte0 | name | zigzag(start - prev end) | [span: end - start] | zigzag(step - prev step)
//       | [arg] | [counter: zigzag int or 8-byte double].
void encode_events(std::string& out, uint64_t track, const Record* r, uint32_t n) {
  if (n == 0) return;
  size_t at;
  begin_chunk(out, kChunkEvents, &at);
  const int64_t base_ns = g_conv.to_ns(r[0].t0);
  put_varint(out, track);
  put_varint(out, n);
  put_varint(out, zigzag(base_ns));
  put_varint(out, zigzag(r[0].step));
  int64_t prev_end = base_ns;
  int32_t prev_step = r[0].step;
  for (uint32_t i = 0; i < n; ++i) {
    const Record& e = r[i];
    uint8_t b0 = uint8_t(e.kind | (e.cat << 2) | (e.flags & kHasArg));
    double value = 0;
    int64_t ivalue = 0;
    const bool counter = e.kind == kCounter;
    if (counter) {
      std::memcpy(&value, &e.t1, 8);
      if (value == double(int64_t(value)) && value > -9e15 && value < 9e15) {
        ivalue = int64_t(value);
        b0 |= kIntValue;
      }
    }
    out.push_back(char(b0));
    put_varint(out, e.name);
    // start - previous end: the gap between consecutive phases, a byte or two.
    const int64_t start_ns = g_conv.to_ns(e.t0);
    put_varint(out, zigzag(start_ns - prev_end));
    int64_t end_ns = start_ns;
    if (e.kind == kSpan) {
      end_ns = std::max(start_ns, g_conv.to_ns(e.t1));
      put_varint(out, uint64_t(end_ns - start_ns));
    }
    prev_end = end_ns;
    put_varint(out, zigzag(int64_t(e.step) - prev_step));
    prev_step = e.step;
    if (e.flags & kHasArg) put_varint(out, e.arg);
    if (counter) {
      if (b0 & kIntValue) {
        put_varint(out, zigzag(ivalue));
      } else {
        out.append(reinterpret_cast<const char*>(&value), 8);
      }
    }
  }
  end_chunk(out, kChunkEvents, at);
  g_w.written.fetch_add(n, std::memory_order_relaxed);
}

void encode_track(std::string& out, const ThreadState& ts) {
  size_t at;
  begin_chunk(out, kChunkTrack, &at);
  put_varint(out, ts.tid);
  put_varint(out, ts.tid);
  put_varint(out, 0);  // track kind: 0 = CPU thread
  put_varint(out, ts.name.size());
  out += ts.name;
  end_chunk(out, kChunkTrack, at);
}

void encode_names(std::string& out) {
  std::lock_guard<std::mutex> lk(g_names_mu);
  if (g_w.names_written >= g_names.size()) return;
  size_t at;
  begin_chunk(out, kChunkNames, &at);
  put_varint(out, g_names.size() - g_w.names_written);
  for (size_t i = g_w.names_written; i < g_names.size(); ++i) {
    put_varint(out, i);
    put_varint(out, g_names[i].size());
    out += g_names[i];
  }
  g_w.names_written = g_names.size();
  end_chunk(out, kChunkNames, at);
}

void encode_stats(std::string& out, uint8_t type) {
  size_t at;
  begin_chunk(out, type, &at);
  put_varint(out, g_dropped.load() + gpu_dropped());
  put_varint(out, g_w.written.load() + gpu_written());
  end_chunk(out, type, at);
}

void fail(const std::string& why) {
  g_enabled.store(false);
  if (!g_failed.exchange(true)) {
    g_w.error = why;
    if (g_w.opening) return;
    std::fprintf(stderr,
                 "stepscope: %s; profiling is turned off, the program continues unaffected\n",
                 why.c_str());
    std::fflush(stderr);
  }
}

// The job's disk comes first: a write that would leave its file system with less
// free space than the floor (the larger of a size and a fraction of the file
// system) is not made, and the trace ends there, so that a checkpoint the job
// writes next still fits.
bool leaves_floor(size_t len) {
  struct statvfs fs;
  if (::fstatvfs(g_w.fd, &fs) != 0 || fs.f_frsize == 0) return true;  // unknown: write
  const double unit = double(fs.f_frsize);
  const double avail = double(fs.f_bavail) * unit;
  const double floor = std::max(double(g_w.floor_bytes), g_w.floor_fraction * double(fs.f_blocks) * unit);
  if (avail >= double(len) + floor) return true;
  char figures[128];
  std::snprintf(figures, sizeof figures, "its file system has %.1f MiB free and stepscope leaves at least %.1f MiB",
                avail / (1 << 20), floor / (1 << 20));
  fail("stopped writing " + g_w.path + ": " + figures +
       " to the job (STEPSCOPE_DISK_FLOOR_MB, STEPSCOPE_DISK_FLOOR_PCT)");
  return false;
}

bool write_all(const std::string& data) {
  if (g_failed.load() || g_w.fd < 0) return false;
  if ((g_w.floor_bytes || g_w.floor_fraction > 0) && !leaves_floor(data.size())) return false;
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t k = ::write(g_w.fd, p, left);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      fail("cannot write " + g_w.path + ": " + std::strerror(k < 0 ? errno : EIO));
      return false;
    }
    p += k;
    left -= size_t(k);
  }
  g_w.bytes.fetch_add(data.size(), std::memory_order_relaxed);
  return true;
}

// One flush: takes the full chunks and the committed part of every live
// thread's current chunk, encodes them, writes names first, then events.
void flush_once(bool final_pass) {
  g_conv.add_anchor();
  Chunk* full;
  std::vector<std::pair<ThreadState*, Chunk*>> live;
  std::vector<ThreadState*> undescribed;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    full = g_full_head;
    g_full_head = g_full_tail = nullptr;
    g_full_count = 0;
    for (ThreadState* ts = g_threads; ts; ts = ts->next) {
      if (!ts->described) {
        ts->described = true;
        undescribed.push_back(ts);
      }
      if (ts->cur) live.emplace_back(ts, ts->cur);
    }
  }
  std::string events;
  for (ThreadState* ts : undescribed) encode_track(events, *ts);
  std::vector<Chunk*> done;
  for (Chunk* c = full; c;) {
    Chunk* next = c->next;
    uint32_t n = c->committed.load(std::memory_order_acquire);
    encode_events(events, c->track, c->recs + c->flushed, n - c->flushed);
    done.push_back(c);
    c = next;
  }
  for (auto& [ts, c] : live) {
    (void)ts;
    uint32_t n = c->committed.load(std::memory_order_acquire);
    encode_events(events, c->track, c->recs + c->flushed, n - c->flushed);
    c->flushed = n;
  }
  encode_gpu(events);
  encode_pysamples(events);
  std::string& out = g_w.buf;
  out.clear();
  encode_names(out);  // after events were read: every name they use exists
  out += events;
  encode_stats(out, final_pass ? kChunkEnd : kChunkStats);
  write_all(out);
  if (out.capacity() > (8u << 20)) std::string().swap(out);
  std::lock_guard<std::mutex> lk(g_mu);
  for (Chunk* c : done) free_chunk_locked(c);
}

void writer_main() {
  pthread_setname_np(pthread_self(), "stepscope-write");
  std::unique_lock<std::mutex> lk(g_w.wake_mu);
  while (!g_w.stop) {
    g_w.wake.wait_for(lk, std::chrono::milliseconds(g_w.flush_ms),
                      [] { return g_w.stop || g_w.urgent; });
    if (g_w.stop) break;
    g_w.urgent = false;
    lk.unlock();
    flush_once(false);
    lk.lock();
  }
}

// A new trace starts with fresh counters and writes every name again.
void reset_writer_state() {
  g_w.stop = false;
  g_w.urgent = false;
  g_w.names_written = 0;
  g_w.written = 0;
  g_w.bytes = 0;
  g_w.error.clear();
  g_dropped = 0;
  g_names_folded = 0;
  g_failed = false;
}

void at_fork_prepare() {
  g_names_mu.lock();
  g_mu.lock();
}
void at_fork_parent() {
  g_mu.unlock();
  g_names_mu.unlock();
}
// The child has only the forking thread: drop the parent's buffers, files and
// writer; Python's after-fork hook reopens a trace of the child's own.
void at_fork_child() {
  sampler_after_fork_child();
  reset_gpu_state(true);
  cupti_after_fork_child();
  new (&g_mu) std::mutex();
  new (&g_names_mu) std::mutex();
  g_enabled.store(false);
  ++g_generation;
  for (ThreadState* ts = g_threads; ts;) {
    ThreadState* next = ts->next;
    if (ts->cur) free_chunk_locked(ts->cur);
    delete ts;
    ts = next;
  }
  g_threads = nullptr;
  tls_state = nullptr;
  for (Chunk* c = g_full_head; c;) {
    Chunk* next = c->next;
    free_chunk_locked(c);
    c = next;
  }
  g_full_head = g_full_tail = nullptr;
  g_full_count = 0;
  new (&g_w.thread) std::thread();  // the writer thread does not exist in the child
  new (&g_w.wake_mu) std::mutex();
  new (&g_w.wake) std::condition_variable();
  if (g_w.fd >= 0) ::close(g_w.fd);
  g_w.fd = -1;
  reset_writer_state();
}

}  // namespace

void init_clock() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_conv.init();
    pthread_atfork(at_fork_prepare, at_fork_parent, at_fork_child);
  });
}

const TickConverter& converter() { return g_conv; }

std::string open_writer(const WriterOptions& opt) {
  init_clock();
  if (g_w.fd >= 0) return "a trace is already being written to " + g_w.path;
  int fd = ::open(opt.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot create " + opt.path + ": " + std::strerror(errno);
  g_w.fd = fd;
  g_w.path = opt.path;
  g_w.flush_ms = opt.flush_interval_ms > 0 ? opt.flush_interval_ms : 1000;
  reset_writer_state();
  g_w.floor_bytes = opt.disk_floor_bytes;
  g_w.floor_fraction = std::min(std::max(opt.disk_floor_fraction, 0.0), 1.0);
  reset_gpu_state(false);
  reset_steps();
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_chunks_max = std::max<size_t>(4, opt.buffer_bytes / sizeof(Chunk));
  }
  std::string header(kFileMagic, 8);
  uint16_t v[2] = {kFormatMajor, kFormatMinor};
  header.append(reinterpret_cast<const char*>(v), 4);
  uint32_t jlen = uint32_t(opt.header_json.size());
  header.append(reinterpret_cast<const char*>(&jlen), 4);
  header += opt.header_json;
  g_w.opening = true;
  const bool header_written = write_all(header);
  g_w.opening = false;
  if (!header_written) {
    std::string err = g_w.error;
    g_w.error.clear();  // not printed: the caller reports it (safety.report_failure)
    ::close(fd);
    ::unlink(opt.path.c_str());  // no empty trace left behind
    g_w.fd = -1;
    return err;
  }
  g_enabled.store(true);
  try {
    g_w.thread = std::thread(writer_main);
  } catch (const std::exception& e) {
    g_enabled.store(false);
    ::close(fd);
    g_w.fd = -1;
    return std::string("cannot start the writer thread: ") + e.what();
  }
  return {};
}

void close_writer() {
  stop_sampler();
  stop_pysampler();  // its last samples go into the final flush
  if (g_w.fd < 0 && !g_w.thread.joinable()) return;
  end_step();
  g_enabled.store(false);
  {
    std::lock_guard<std::mutex> lk(g_w.wake_mu);
    g_w.stop = true;
  }
  g_w.wake.notify_one();
  if (g_w.thread.joinable()) g_w.thread.join();
  // Threads still alive keep their current chunk; flush what they committed.
  flush_once(true);
  if (g_w.fd >= 0) ::close(g_w.fd);
  g_w.fd = -1;
  // Give the pool's idle memory back; live threads keep their current chunk.
  std::lock_guard<std::mutex> lk(g_mu);
  while (g_free) {
    Chunk* c = g_free;
    g_free = c->next;
    delete c;
    --g_chunks_total;
  }
}

WriterStats writer_stats() {
  size_t in_use;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    size_t free_n = 0;
    for (Chunk* c = g_free; c; c = c->next) ++free_n;
    in_use = g_chunks_total - free_n;
  }
  return {g_w.written.load() + gpu_written(), g_dropped.load() + gpu_dropped(), g_w.bytes.load(), in_use,
          g_names_folded.load(), g_w.error};
}

}  // namespace stepscope
