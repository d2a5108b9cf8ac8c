// The GPU activity queue, launch-config table and GPU chunk encoding (see gpu.h).
#include "record/gpu.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>

#include "common/encoding.h"
#include "common/format.h"

namespace stepscope {

bool LaunchConfig::operator==(const LaunchConfig& o) const {
  return std::memcmp(this, &o, sizeof *this) == 0;
}

namespace {

struct ConfigHash {
  size_t operator()(const LaunchConfig& c) const {
    uint64_t h = 1469598103934665603ull;
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&c);
    for (size_t i = 0; i < sizeof c / 4; ++i) h = (h ^ w[i]) * 1099511628211ull;
    return size_t(h);
  }
};

// A dense kernel stream fills CUPTI buffers far faster than one flush interval
// drains... only if the writer stalls: the bound keeps memory finite then.
constexpr size_t kMaxQueued = size_t(1) << 19;  // ~28 MiB of records
constexpr uint32_t kMaxRecordsPerChunk = 1u << 16;

std::mutex g_gpu_mu;  // guards everything below
std::vector<GpuRecord> g_queue;
std::vector<LaunchConfig> g_configs;
std::unordered_map<LaunchConfig, uint32_t, ConfigHash> g_config_ids;
size_t g_configs_written = 0;
std::map<std::pair<uint32_t, uint32_t>, uint64_t> g_tracks;  // (device, stream) -> track id
uint64_t g_written = 0, g_dropped = 0;

bool is_api(uint8_t type) { return type == kGpuRuntime || type == kGpuDriver; }

// TRACK chunk of a GPU stream (kind 1) or of the process's CUDA API calls (kind 2):
// track_id | os_tid (0) | kind | name | device | stream.
void encode_track(std::string& out, uint64_t id, uint32_t device, uint32_t stream) {
  const bool api = stream == kApiStream;
  std::string name = api ? "CUDA API" : "GPU " + std::to_string(device) + " stream " + std::to_string(stream);
  std::string p;
  put_varint(p, id);
  put_varint(p, 0);
  put_varint(p, api ? kTrackCudaApi : kTrackGpuStream);
  put_varint(p, name.size());
  p += name;
  put_varint(p, device);
  put_varint(p, stream);
  append_chunk(out, kChunkTrack, p);
}

// GPU chunk: track | device | stream | count | base_ns | base_corr, then records:
// byte0 = type | sub << 3; zigzag(start - prev end); duration; zigzag(corr - prev corr);
// kernel: name, config | memcpy: sub2 byte, bytes | memset: bytes | sync: - |
// API call: name, thread.
void encode_records(std::string& out, uint64_t track, uint32_t device, uint32_t stream,
                    const GpuRecord* const* r, size_t n) {
  std::string p;
  p.reserve(n * 12 + 32);
  put_varint(p, track);
  put_varint(p, device);
  put_varint(p, stream);
  put_varint(p, n);
  int64_t prev_end = int64_t(r[0]->start_ns);
  int64_t prev_corr = int64_t(r[0]->correlation);
  put_varint(p, zigzag(prev_end));
  put_varint(p, prev_corr);
  for (size_t i = 0; i < n; ++i) {
    const GpuRecord& e = *r[i];
    p.push_back(char((e.type & 7) | (std::min<uint8_t>(e.sub, 31) << 3)));
    const int64_t start = int64_t(e.start_ns), end = std::max(start, int64_t(e.end_ns));
    put_varint(p, zigzag(start - prev_end));
    put_varint(p, uint64_t(end - start));
    put_varint(p, zigzag(int64_t(e.correlation) - prev_corr));
    prev_end = end;
    prev_corr = e.correlation;
    switch (e.type) {
      case kGpuKernel:
        put_varint(p, e.name);
        put_varint(p, e.config);
        break;
      case kGpuMemcpy:
        p.push_back(char(e.sub2));
        put_varint(p, e.bytes);
        break;
      case kGpuMemset:
        put_varint(p, e.bytes);
        break;
      case kGpuSync:
        break;
      default:  // API calls
        put_varint(p, e.name);
        put_varint(p, e.thread);
        break;
    }
  }
  append_chunk(out, kChunkGpu, p);
}

}  // namespace

uint32_t intern_launch_config(const LaunchConfig& c) {
  std::lock_guard<std::mutex> lk(g_gpu_mu);
  auto it = g_config_ids.find(c);
  if (it != g_config_ids.end()) return it->second;
  const uint32_t id = uint32_t(g_configs.size());
  g_configs.push_back(c);
  g_config_ids.emplace(c, id);
  return id;
}

size_t gpu_enqueue(const GpuRecord* r, size_t n) {
  std::lock_guard<std::mutex> lk(g_gpu_mu);
  const size_t room = g_queue.size() < kMaxQueued ? kMaxQueued - g_queue.size() : 0;
  const size_t take = std::min(n, room);
  g_queue.insert(g_queue.end(), r, r + take);
  g_dropped += n - take;
  return n - take;
}

void encode_gpu(std::string& out) {
  std::vector<GpuRecord> batch;
  std::vector<LaunchConfig> new_configs;
  size_t first_config;
  {
    std::lock_guard<std::mutex> lk(g_gpu_mu);
    batch.swap(g_queue);
    first_config = g_configs_written;
    new_configs.assign(g_configs.begin() + long(g_configs_written), g_configs.end());
    g_configs_written = g_configs.size();
  }
  if (!new_configs.empty()) {
    // LAUNCH_CONFIGS chunk: count, then (id, grid xyz, block xyz, registers,
    // static shared memory, dynamic shared memory) per config.
    std::string p;
    put_varint(p, new_configs.size());
    for (size_t i = 0; i < new_configs.size(); ++i) {
      const LaunchConfig& c = new_configs[i];
      put_varint(p, first_config + i);
      for (uint32_t v : {c.grid[0], c.grid[1], c.grid[2], c.block[0], c.block[1], c.block[2],
                         c.registers, c.static_smem, c.dynamic_smem})
        put_varint(p, v);
    }
    append_chunk(out, kChunkLaunchConfigs, p);
  }
  if (batch.empty()) return;
  // Group by track, keeping arrival order within a track (CUPTI delivers a
  // stream's records in order; readers sort by time anyway).
  std::map<std::pair<uint32_t, uint32_t>, std::vector<const GpuRecord*>> by_track;
  for (const GpuRecord& r : batch) {
    const bool api = is_api(r.type);
    by_track[{api ? 0u : r.device, api ? kApiStream : r.stream}].push_back(&r);
  }
  for (auto& [key, recs] : by_track) {
    uint64_t id;
    {
      std::lock_guard<std::mutex> lk(g_gpu_mu);
      auto it = g_tracks.find(key);
      if (it == g_tracks.end()) {
        // Track ids of GPU activity live above every OS thread id.
        id = (uint64_t(1) << 40) + g_tracks.size();
        g_tracks.emplace(key, id);
        encode_track(out, id, key.first, key.second);
      } else {
        id = it->second;
      }
    }
    for (size_t at = 0; at < recs.size(); at += kMaxRecordsPerChunk) {
      const size_t n = std::min<size_t>(kMaxRecordsPerChunk, recs.size() - at);
      encode_records(out, id, key.first, key.second, recs.data() + at, n);
    }
  }
  std::lock_guard<std::mutex> lk(g_gpu_mu);
  g_written += batch.size();
}

void reset_gpu_state(bool after_fork) {
  if (after_fork) new (&g_gpu_mu) std::mutex();
  std::lock_guard<std::mutex> lk(g_gpu_mu);
  g_queue.clear();
  g_queue.shrink_to_fit();
  g_configs_written = 0;
  g_tracks.clear();
  g_written = g_dropped = 0;
}

uint64_t gpu_written() {
  std::lock_guard<std::mutex> lk(g_gpu_mu);
  return g_written;
}

void gpu_add_dropped(uint64_t n) {
  std::lock_guard<std::mutex> lk(g_gpu_mu);
  g_dropped += n;
}

uint64_t gpu_dropped() {
  std::lock_guard<std::mutex> lk(g_gpu_mu);
  return g_dropped;
}

}  // namespace stepscope
