// The trace's chunks as bytes (docs/format.md): a thread's events, its track, the
// names defined since the last flush, the counts. The writer thread calls them.
#include <algorithm>
#include <cstring>

#include "common/encoding.h"
#include "record/buffers.h"
#include "record/gpu.h"

namespace stepscope {
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

}  // namespace

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

}  // namespace stepscope
