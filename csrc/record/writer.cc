// The background writer: encodes the chunks, names, GPU records and Python samples every
// flush and writes them to the trace file, keeping the disk floor; opens and closes traces.
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
#include "record/buffers.h"
#include "record/recorder.h"
#include "record/sampler.h"

namespace stepscope {

Writer g_w;
TickConverter g_conv;

namespace {

std::atomic<bool> g_failed{false};

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

void choose_clock(bool monotonic) {
  init_clock();
  if (monotonic == monotonic_forced() || g_w.fd >= 0) return;  // unchanged, or ticks already kept
  force_monotonic(monotonic);
  g_conv.init();
}

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