// System sampler: a native thread that reads /proc every interval and records
// the raw counters (jiffies, bytes, sectors) as counter events of category
// system. No Python runs on this path, so the GIL never delays it, and rates
// are computed at read time from the raw values.
//
// Node metrics (CPU, memory, disks, network, load) are sampled by one process
// per host (the Python side elects it); every rank or script samples its own
// resource use (RSS, CPU time, threads, I/O bytes) and its child processes'
// (DataLoader workers), which are so attributed to it.
//
// Files that change slowly or are read as rates are read once a second
// (kSlowMs), not every interval: the load average (the kernel's own minute
// average, updated every 5 s), memory, disks, network and the processes' I/O
// bytes. Each /proc file read costs 40-60 us of cold kernel formatting, and at
// 100 ms these were over half the sampler's idle cost. CPU, context switches
// and the processes' CPU time and RSS (the step-level quantities) keep the
// interval.
//
// Metric names are "<metric>|<device>" (device may be empty), interned once.
#include "record/sampler.h"

#include <dirent.h>
#include <pthread.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "record/procfs.h"
#include "record/recorder.h"

namespace stepscope {
namespace {

using procfs::ProcFile;
using procfs::fields;
using procfs::for_lines;
using procfs::num;

struct State {
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool running = false;
  int interval_ms = 100;
  bool node = false;
  bool processes = false;
  std::vector<int> children;  // child processes (DataLoader workers...), refreshed each second
  int refresh_in = 0;
  int slow_in = 0;    // ticks until the slow files are read again
  bool fast = true;   // this pass reads the interval's files
  bool slow = false;  // this pass reads the slow files
  ProcFile stat, meminfo, loadavg, diskstats, netdev, self_stat, self_io;
  std::vector<std::string> disks;  // whole disks from /sys/block
  std::unordered_map<std::string, uint32_t> ids;
  std::string buf;
  std::string proc = "/proc";  // or STEPSCOPE_PROC_ROOT: a stand-in tree, for tests
  uint64_t sample_tick = 0;
  long page_size = 4096;
} g_s;

uint32_t metric_id(const char* metric, const std::string& device) {
  std::string key(metric);
  key += '|';
  key += device;
  auto it = g_s.ids.find(key);
  if (it != g_s.ids.end()) return it->second;
  uint32_t id = intern(key);
  g_s.ids.emplace(std::move(key), id);
  return id;
}

inline void emit(const char* metric, const std::string& device, double value) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  uint64_t bits;
  std::memcpy(&bits, &value, 8);
  push(kCounter, kCatSystem, metric_id(metric, device), g_s.sample_tick, bits, 0, 0);
}

void sample_stat() {
  if (!g_s.stat.read(g_s.buf)) return;
  std::vector<std::pair<const char*, size_t>> f;
  for_lines(g_s.buf, [&](const char* p, const char* e) {
    if (e - p > 3 && std::strncmp(p, "cpu", 3) == 0) {
      fields(p, e, f);
      if (f.size() < 9) return;
      std::string dev(f[0].first, f[0].second);
      if (dev == "cpu") dev = "all";
      double user = num(f[1]), nice = num(f[2]), sys = num(f[3]), idle = num(f[4]), iowait = num(f[5]),
             irq = num(f[6]), softirq = num(f[7]), steal = num(f[8]);
      emit("cpu.busy", dev, user + nice + sys + irq + softirq + steal);
      emit("cpu.idle", dev, idle);
      emit("cpu.iowait", dev, iowait);
    } else if (e - p > 5 && std::strncmp(p, "ctxt ", 5) == 0) {
      emit("ctxt", "", std::strtod(p + 5, nullptr));
    } else if (e - p > 14 && std::strncmp(p, "procs_running ", 14) == 0) {
      emit("procs_running", "", std::strtod(p + 14, nullptr));
    }
  });
}

void sample_meminfo() {
  if (!g_s.meminfo.read(g_s.buf)) return;
  for_lines(g_s.buf, [&](const char* p, const char* e) {
    (void)e;
    if (std::strncmp(p, "MemTotal:", 9) == 0) emit("mem.total", "", std::strtod(p + 9, nullptr) * 1024);
    else if (std::strncmp(p, "MemAvailable:", 13) == 0)
      emit("mem.available", "", std::strtod(p + 13, nullptr) * 1024);
  });
}

void sample_loadavg() {
  if (!g_s.loadavg.read(g_s.buf)) return;
  emit("load1", "", std::strtod(g_s.buf.c_str(), nullptr));
}

void sample_diskstats() {
  if (!g_s.diskstats.read(g_s.buf)) return;
  std::vector<std::pair<const char*, size_t>> f;
  for_lines(g_s.buf, [&](const char* p, const char* e) {
    fields(p, e, f);
    if (f.size() < 10) return;
    std::string dev(f[2].first, f[2].second);
    bool whole = false;
    for (const auto& d : g_s.disks) whole |= d == dev;
    if (!whole) return;
    emit("disk.reads", dev, num(f[3]));
    emit("disk.read_bytes", dev, num(f[5]) * 512);
    emit("disk.writes", dev, num(f[7]));
    emit("disk.write_bytes", dev, num(f[9]) * 512);
  });
}

void sample_netdev() {
  if (!g_s.netdev.read(g_s.buf)) return;
  std::vector<std::pair<const char*, size_t>> f;
  for_lines(g_s.buf, [&](const char* p, const char* e) {
    const char* colon = static_cast<const char*>(std::memchr(p, ':', size_t(e - p)));
    if (!colon) return;
    const char* s = p;
    while (s < colon && *s == ' ') ++s;
    std::string dev(s, size_t(colon - s));
    if (dev == "lo") return;
    fields(colon + 1, e, f);
    if (f.size() < 9) return;
    emit("net.rx_bytes", dev, num(f[0]));
    emit("net.tx_bytes", dev, num(f[8]));
  });
}

// One process's counters from /proc/<pid>/stat and /io; device "" is this process.
void sample_process(ProcFile& stat_file, ProcFile& io_file, const std::string& device) {
  if (g_s.fast && stat_file.read(g_s.buf)) {
    // Fields after the command name, which may contain spaces: start past the last ')'.
    size_t close = g_s.buf.rfind(')');
    if (close != std::string::npos) {
      std::vector<std::pair<const char*, size_t>> f;
      fields(g_s.buf.data() + close + 1, g_s.buf.data() + g_s.buf.size(), f);
      // f[0] is field 3 (state): utime=14, stime=15, num_threads=20, rss=24.
      if (f.size() > 21) {
        emit("proc.utime", device, num(f[11]));
        emit("proc.stime", device, num(f[12]));
        emit("proc.threads", device, num(f[17]));
        emit("proc.rss", device, num(f[21]) * double(g_s.page_size));
      }
    }
  }
  if (g_s.slow && io_file.read(g_s.buf)) {
    for_lines(g_s.buf, [&](const char* p, const char* e) {
      (void)e;
      if (std::strncmp(p, "rchar:", 6) == 0) emit("proc.rchar", device, std::strtod(p + 6, nullptr));
      else if (std::strncmp(p, "wchar:", 6) == 0) emit("proc.wchar", device, std::strtod(p + 6, nullptr));
      else if (std::strncmp(p, "read_bytes:", 11) == 0)
        emit("proc.read_bytes", device, std::strtod(p + 11, nullptr));
      else if (std::strncmp(p, "write_bytes:", 12) == 0)
        emit("proc.write_bytes", device, std::strtod(p + 12, nullptr));
    });
  }
}

bool read_small(const std::string& path, std::string& out) {
  ProcFile f;
  if (!f.open_file(path)) return false;
  bool ok = f.read(out);
  f.close_file();
  return ok;
}

// Children of this process: /proc/self/task/*/children where the kernel has
// it, else a scan of /proc for our pid as parent.
void refresh_children() {
  g_s.children.clear();
  std::string text;
  bool have_children_files = false;
  if (DIR* d = opendir((g_s.proc + "/self/task").c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      if (!read_small(g_s.proc + "/self/task/" + e->d_name + "/children", text)) continue;
      have_children_files = true;
      const char* p = text.c_str();
      char* end;
      for (long pid = std::strtol(p, &end, 10); end != p; pid = std::strtol(p, &end, 10)) {
        g_s.children.push_back(int(pid));
        p = end;
      }
    }
    closedir(d);
  }
  if (have_children_files) return;
  const long self = long(getpid());
  if (DIR* d = opendir(g_s.proc.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      if (!read_small(g_s.proc + "/" + e->d_name + "/stat", text)) continue;
      size_t close = text.rfind(')');
      if (close == std::string::npos) continue;
      long ppid = 0;
      if (std::sscanf(text.c_str() + close + 1, " %*c %ld", &ppid) == 1 && ppid == self)
        g_s.children.push_back(std::atoi(e->d_name));
    }
    closedir(d);
  }
}

constexpr int kSlowMs = 1000;

int slow_period() { return std::max(1, kSlowMs / g_s.interval_ms); }  // in ticks

void sample_processes() {
  sample_process(g_s.self_stat, g_s.self_io, "");
  if (g_s.fast && --g_s.refresh_in <= 0) {
    refresh_children();
    g_s.refresh_in = slow_period();
  }
  for (int pid : g_s.children) {
    ProcFile st, io;
    const std::string base = g_s.proc + "/" + std::to_string(pid);
    if (!st.open_file(base + "/stat")) continue;  // exited since the last refresh
    if (g_s.slow) io.open_file(base + "/io");
    sample_process(st, io, "pid" + std::to_string(pid));
    st.close_file();
    io.close_file();
  }
}

void sample_pass() {
  g_s.sample_tick = ticks();
  if (g_s.node) {
    if (g_s.fast) sample_stat();
    if (g_s.slow) {
      sample_meminfo();
      sample_loadavg();
      sample_diskstats();
      sample_netdev();
    }
  }
  if (g_s.processes) sample_processes();
}

void sample_once() {
  g_s.fast = true;
  g_s.slow = --g_s.slow_in <= 0;
  if (g_s.slow) g_s.slow_in = slow_period();
  sample_pass();
}

// At stop, the slow files once more if a tick passed since they were read, so a
// run shorter than a second still has two readings of them (a rate). Only
// them: CPU jiffies over a few ms would be a 0% or 100% reading.
void sample_last() {
  if (g_s.slow_in >= slow_period()) return;
  g_s.fast = false;
  g_s.slow = true;
  sample_pass();
}

void sampler_main() {
  pthread_setname_np(pthread_self(), "stepscope-smpl");
  auto next = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(g_s.mu);
  while (!g_s.stop) {
    lk.unlock();
    sample_once();
    lk.lock();
    next += std::chrono::milliseconds(g_s.interval_ms);
    auto now = std::chrono::steady_clock::now();
    if (next < now) next = now;  // fell behind (suspended, overloaded): skip, never burst
    g_s.cv.wait_until(lk, next, [] { return g_s.stop; });
  }
  lk.unlock();
  sample_last();
}

std::vector<std::string> whole_disks() {
  std::vector<std::string> out;
  DIR* d = opendir("/sys/block");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == ".." || n.rfind("loop", 0) == 0 || n.rfind("ram", 0) == 0) continue;
    out.push_back(n);
  }
  closedir(d);
  return out;
}

// STEPSCOPE_PROC_ROOT, from the settings (core/config.py): read at each start.
std::string g_proc_root;

}  // namespace

void set_proc_root(const std::string& root) { g_proc_root = root; }

std::vector<std::string> start_sampler(int interval_ms, bool node, bool processes) {
  std::vector<std::string> notes;
  stop_sampler();
  if (!node && !processes) return notes;
  g_s.interval_ms = interval_ms > 0 ? interval_ms : 100;
  g_s.node = node;
  g_s.processes = processes;
  g_s.refresh_in = 0;
  g_s.slow_in = 0;
  g_s.stop = false;
  g_s.page_size = sysconf(_SC_PAGESIZE);
  g_s.proc = g_proc_root.empty() ? "/proc" : g_proc_root;
  auto need = [&](ProcFile& f, const char* rel, const char* what) {
    const std::string path = g_s.proc + rel;
    if (!f.open_file(path)) notes.push_back(std::string(what) + " not measured: cannot read " + path);
  };
  if (node) {
    need(g_s.stat, "/stat", "CPU utilization");
    need(g_s.meminfo, "/meminfo", "memory");
    need(g_s.loadavg, "/loadavg", "load average");
    need(g_s.diskstats, "/diskstats", "disk throughput");
    need(g_s.netdev, "/net/dev", "network throughput");
    g_s.disks = whole_disks();
  }
  if (processes) {
    need(g_s.self_stat, "/self/stat", "process CPU time and RSS");
    need(g_s.self_io, "/self/io", "process I/O bytes");
  }
  // A file that opens but cannot be read (some containers) is a note too.
  for (ProcFile* f : {&g_s.stat, &g_s.meminfo, &g_s.loadavg, &g_s.diskstats, &g_s.netdev, &g_s.self_stat,
                      &g_s.self_io}) {
    if (f->fd >= 0 && !f->read(g_s.buf)) {
      notes.push_back("not measured: cannot read " + f->path);
      f->close_file();
    }
  }
  try {
    g_s.thread = std::thread(sampler_main);
    g_s.running = true;
  } catch (const std::exception& e) {
    notes.push_back(std::string("system metrics off: cannot start the sampler thread: ") + e.what());
  }
  return notes;
}

void stop_sampler() {
  if (g_s.running) {
    {
      std::lock_guard<std::mutex> lk(g_s.mu);
      g_s.stop = true;
    }
    g_s.cv.notify_one();
    if (g_s.thread.joinable()) g_s.thread.join();
    g_s.running = false;
  }
  for (ProcFile* f : {&g_s.stat, &g_s.meminfo, &g_s.loadavg, &g_s.diskstats, &g_s.netdev, &g_s.self_stat,
                      &g_s.self_io})
    f->close_file();
}

double sampler_pass_ns(int passes) {
  // The cost of one sampling pass, without the thread's wake-up (a benchmark).
  if (!g_s.running) return -1;
  std::lock_guard<std::mutex> lk(g_s.mu);  // keeps the sampler thread out meanwhile
  const int64_t t0 = mono_ns();
  for (int i = 0; i < passes; ++i) sample_once();
  return double(mono_ns() - t0) / passes;
}

void sampler_after_fork_child() {
  // The sampler thread does not exist in the child; forget it without joining.
  new (&g_s.thread) std::thread();
  new (&g_s.mu) std::mutex();
  new (&g_s.cv) std::condition_variable();
  g_s.running = false;
  g_s.stop = false;
  // /proc/self in the child is the child: reopen on the next start.
  for (ProcFile* f : {&g_s.stat, &g_s.meminfo, &g_s.loadavg, &g_s.diskstats, &g_s.netdev, &g_s.self_stat,
                      &g_s.self_io})
    f->close_file();
}

}  // namespace stepscope
