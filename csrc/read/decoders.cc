// The trace reader's chunk decoders: one events, GPU, Python stacks or Python samples
// chunk into the columns (docs/format.md), whatever damage the checksum let through.
#include <cmath>

#include "common/format.h"
#include "read/decoders.h"

namespace stepscope {
namespace decode {

uint64_t events_at(Columns& c, size_t base, uint64_t room, const uint8_t* p, uint32_t len, const std::string& path,
                   size_t offset, std::vector<std::string>& warnings) {
  Cursor cur{p, p + len};
  const int64_t track = int64_t(cur.varint());
  const uint64_t n = cur.varint();
  int64_t prev_end = unzigzag(cur.varint());
  int64_t prev_step = unzigzag(cur.varint());
  if (!cur.ok || n > len || n > room) {
    warnings.push_back(path + ": malformed events chunk at offset " + std::to_string(offset) + ", skipped");
    return 0;
  }
  uint64_t i = 0;
  for (; i < n && cur.ok; ++i) {
    const uint8_t b0 = cur.byte();
    const uint8_t kind = b0 & 3;
    const size_t j = base + i;
    if (kind > kCounter) {  // kind 3 is no event: damage the CRC did not catch (or a 1.0-1.2 file)
      cur.ok = false;
      continue;
    }
    c.kind[j] = kind;
    c.cat[j] = (b0 >> 2) & 15;
    c.name[j] = uint32_t(cur.varint());
    const int64_t start = prev_end + unzigzag(cur.varint());
    const int64_t end = kind == kSpan ? start + int64_t(cur.varint()) : start;
    prev_end = end;
    c.start[j] = start;
    c.end[j] = end;
    prev_step += unzigzag(cur.varint());
    c.step[j] = int32_t(prev_step);
    c.arg[j] = (b0 & kHasArg) ? int64_t(cur.varint()) : -1;
    c.track[j] = track;
    if (kind == kCounter) {
      c.value[j] = (b0 & kIntValue) ? double(unzigzag(cur.varint())) : cur.f64();
    } else {
      c.value[j] = NAN;
    }
  }
  if (!cur.ok) {
    // The CRC matched, so this is a writer bug or an unknown encoding: keep
    // the events decoded before the damage.
    warnings.push_back(path + ": undecodable event in chunk at offset " + std::to_string(offset) +
                       ", rest of chunk skipped");
    return i > 0 ? i - 1 : 0;
  }
  return n;
}

void gpu(Columns& c, const uint8_t* p, uint32_t len, const std::string& path, size_t offset) {
  Cursor cur{p, p + len};
  GpuColumns& g = c.gpu;
  const int64_t track = int64_t(cur.varint());
  const uint32_t device = uint32_t(cur.varint());
  const uint32_t stream = uint32_t(cur.varint());
  const uint64_t n = cur.varint();
  int64_t prev_end = unzigzag(cur.varint());
  int64_t prev_corr = int64_t(cur.varint());
  if (!cur.ok || n > len) {
    c.warnings.push_back(path + ": malformed GPU chunk at offset " + std::to_string(offset) + ", skipped");
    return;
  }
  uint64_t i = 0;
  for (; i < n; ++i) {
    const uint8_t b0 = cur.byte();
    const uint8_t type = b0 & 7;
    const int64_t start = prev_end + unzigzag(cur.varint());
    const int64_t end = start + int64_t(cur.varint());
    const int64_t corr = prev_corr + unzigzag(cur.varint());
    uint32_t name = 0, config = 0, thread = 0;
    uint8_t sub2 = 0;
    int64_t bytes = 0;
    switch (type) {
      case 0: name = uint32_t(cur.varint()); config = uint32_t(cur.varint()); break;  // kernel
      case 1: sub2 = cur.byte(); bytes = int64_t(cur.varint()); break;               // memcpy
      case 2: bytes = int64_t(cur.varint()); break;                                   // memset
      case 3: break;                                                                  // sync
      case 4: case 5: name = uint32_t(cur.varint()); thread = uint32_t(cur.varint()); break;
      default: cur.ok = false;  // a newer record type: its length is unknown
    }
    if (!cur.ok) break;
    prev_end = end;
    prev_corr = corr;
    g.type.push_back(type);
    g.sub.push_back(b0 >> 3);
    g.sub2.push_back(sub2);
    g.device.push_back(device);
    g.stream.push_back(stream);
    g.name.push_back(name);
    g.config.push_back(config);
    g.correlation.push_back(uint32_t(corr));
    g.thread.push_back(thread);
    g.start.push_back(start);
    g.end.push_back(end);
    g.bytes.push_back(bytes);
    g.track.push_back(track);
  }
  if (i < n)
    c.warnings.push_back(path + ": undecodable GPU record in chunk at offset " + std::to_string(offset) +
                         ", rest of chunk skipped");
}

// Python stack tables' "never defined" marks: a sample whose stack leads to one is lost.
constexpr uint32_t kUndefined = 0xFFFFFFFFu;
constexpr int32_t kUndefinedParent = -2;

// Each part's entries run from a `first` id; one out of reach ends the chunk (the ids
// after it would be as wrong).
void pystacks(Columns& c, Cursor& cur, const std::string& path, size_t offset, Defined& defined) {
  PyColumns& py = c.py;
  bool reach = true;
  uint64_t first = cur.varint(), n = cur.varint();
  for (uint64_t i = 0; i < n && cur.ok && (reach = within_reach(first + i, defined.strings)); ++i) {
    std::string s = cur.bytes(size_t(cur.varint()));
    if (cur.ok) at_id(py.strings, first + i) = std::move(s);
  }
  if (reach) {
    first = cur.varint();
    n = cur.varint();
  }
  for (uint64_t i = 0; reach && i < n && cur.ok && (reach = within_reach(first + i, defined.frames)); ++i) {
    const uint32_t func = uint32_t(cur.varint()), file = uint32_t(cur.varint());
    const int32_t line = int32_t(unzigzag(cur.varint()));
    if (!cur.ok) break;
    at_id(py.frame_func, first + i, kUndefined) = func;
    at_id(py.frame_file, first + i, kUndefined) = file;
    at_id(py.frame_line, first + i) = line;
  }
  if (reach) {
    first = cur.varint();
    n = cur.varint();
  }
  for (uint64_t i = 0; reach && i < n && cur.ok && (reach = within_reach(first + i, defined.stacks)); ++i) {
    const int32_t parent = int32_t(int64_t(cur.varint()) - 1);
    const uint32_t frame = uint32_t(cur.varint());
    if (!cur.ok) break;
    at_id(py.stack_parent, first + i, kUndefinedParent) = parent;
    at_id(py.stack_frame, first + i, kUndefined) = frame;
  }
  if (!cur.ok || !reach)
    c.warnings.push_back(path + ": malformed Python stacks chunk at offset " + std::to_string(offset) +
                         ", rest of chunk skipped");
}

void pysamples(Columns& c, Cursor& cur, const std::string& path, size_t offset) {
  PyColumns& py = c.py;
  py.interval_ns = int64_t(cur.varint());
  const uint64_t n = cur.varint(), nthreads = cur.varint();
  std::vector<int64_t> tids;
  for (uint64_t i = 0; i < nthreads && cur.ok && i < (1u << 20); ++i) tids.push_back(int64_t(cur.varint()));
  int64_t prev = unzigzag(cur.varint());
  for (uint64_t i = 0; i < n && cur.ok; ++i) {
    prev += unzigzag(cur.varint());
    const uint64_t thread = cur.varint();
    const uint32_t stack = uint32_t(cur.varint());
    if (!cur.ok || thread >= tids.size()) {
      cur.ok = false;
      break;
    }
    py.time.push_back(prev);
    py.tid.push_back(tids[thread]);
    py.stack.push_back(stack);
  }
  if (!cur.ok)
    c.warnings.push_back(path + ": malformed Python samples chunk at offset " + std::to_string(offset) +
                         ", rest of chunk skipped");
}

}  // namespace decode
}  // namespace stepscope
