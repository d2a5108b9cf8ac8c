// The trace reader: maps the file, checks its header and chunk framing, picks the
// part's chunks and hands each to its decoder (decoders.cc) or reads it in place.
#include "read/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "common/encoding.h"
#include "common/format.h"
#include "read/decoders.h"

namespace stepscope {
namespace {

struct Mapped {
  const uint8_t* data = nullptr;
  size_t size = 0;
  explicit Mapped(const std::string& path) {
    // O_NONBLOCK: a FIFO in a trace's place must not hang the reader (it is refused below)
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw FormatError("cannot open " + path + ": " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      ::close(fd);
      throw FormatError("cannot stat " + path);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw FormatError(path + " is not a stepscope trace (not a regular file)");
    }
    size = size_t(st.st_size);
    if (size > 0) {
      void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw FormatError("cannot map " + path + ": " + std::strerror(errno));
      }
      data = static_cast<const uint8_t*>(p);
      madvise(p, size, MADV_SEQUENTIAL);
    }
    ::close(fd);
  }
  ~Mapped() {
    if (data) munmap(const_cast<uint8_t*>(data), size);
  }
};

struct ChunkRef {
  uint8_t type;
  size_t offset;  // of the payload
  uint32_t len;
  uint32_t crc;  // as the header says
};

uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

uint32_t chunk_checksum(const uint8_t* d, const ChunkRef& ch, bool with_header) {
  const uint8_t* payload = d + ch.offset;
  return with_header ? chunk_crc(payload - kChunkHeader, payload, ch.len) : crc32c(payload, ch.len);
}

// Next chunk magic at or after `from`, or `size` if none.
size_t resync(const uint8_t* d, size_t from, size_t size) {
  for (size_t i = from; i + 4 <= size; ++i)
    if (load32(d + i) == kChunkMagic) return i;
  return size;
}
// One warning per unknown chunk type: its count and first offset.
void warn_unknown_chunks(Columns& c, const std::map<uint8_t, std::vector<size_t>>& unknown, const std::string& path) {
  for (const auto& [type, offsets] : unknown)
    c.warnings.push_back(path + ": " + std::to_string(offsets.size()) + " chunk(s) of unknown type " +
                         std::to_string(type) + " skipped (first at offset " + std::to_string(offsets.front()) +
                         "; written by a newer stepscope, or damaged)");
}

// An events chunk of the part: its index, the first row it may fill, how many it holds
// (declared), how many it decoded.
struct EventChunk {
  size_t chunk, base, room, decoded;
};

void resize_events(Columns& c, size_t rows) {  // (new rows are left uninitialised: RowVector)
  for (auto* v : {&c.track, &c.start, &c.end, &c.arg}) v->resize(rows);
  c.kind.resize(rows);
  c.cat.resize(rows);
  c.name.resize(rows);
  c.step.resize(rows);
  c.value.resize(rows);
}

constexpr size_t kRowsPerThread = size_t(1) << 20;  // fewer rows than this a thread: not worth one

// The part's events chunks into the columns (sized for the rows they declare), on a few
// threads for a large part: each chunk fills its own rows. Rows a damaged chunk left
// unfilled are closed up afterwards, so the columns are the chunks' events in file order.
void decode_events(Columns& c, const uint8_t* d, const std::vector<ChunkRef>& chunks, std::vector<EventChunk>& todo,
                   const std::string& path, std::vector<std::vector<std::string>>& warnings) {
  const size_t rows = todo.empty() ? 0 : todo.back().base + todo.back().room;
  size_t threads = std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()), 8, rows / kRowsPerThread});
  threads = std::max<size_t>(threads, 1);
  auto run = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k) {
      EventChunk& e = todo[k];
      const ChunkRef& ch = chunks[e.chunk];
      try {  // (nothing may escape a thread: out of memory for a warning's text, say)
        e.decoded = decode::events_at(c, e.base, e.room, d + ch.offset, ch.len, path, ch.offset - kChunkHeader,
                                      warnings[e.chunk]);
      } catch (...) {
        e.decoded = 0;
      }
    }
  };
  if (threads == 1) {
    run(0, todo.size());
  } else {  // contiguous runs of chunks, about the same rows each
    std::vector<std::thread> pool;
    size_t from = 0;
    for (size_t t = 1; t <= threads && from < todo.size(); ++t) {
      size_t to = from;
      const size_t until = rows * t / threads;
      while (to < todo.size() && (to == from || todo[to].base < until)) ++to;
      if (t == threads) to = todo.size();
      pool.emplace_back(run, from, to);
      from = to;
    }
    for (auto& th : pool) th.join();
  }
  size_t at = 0;  // close up what damaged chunks left unfilled
  for (const EventChunk& e : todo) {
    if (at != e.base) {
      auto move = [&](auto& v) { std::copy(v.begin() + long(e.base), v.begin() + long(e.base + e.decoded), v.begin() + long(at)); };
      move(c.kind), move(c.cat), move(c.name), move(c.track), move(c.start), move(c.end), move(c.arg), move(c.step),
          move(c.value);
    }
    at += e.decoded;
  }
  resize_events(c, at);
}

}  // namespace

Columns read_trace(const std::string& path, uint32_t part, uint32_t parts, uint64_t part_bytes, bool events_wanted,
                   bool gpu_wanted) {
  if (part_bytes == 0 && (parts == 0 || part >= parts)) throw FormatError("part must be in 0..parts-1");
  Mapped m(path);
  const uint8_t* d = m.data;
  Columns c;
  if (m.size < kFileHeaderFixed || std::memcmp(d, kFileMagic, 8) != 0)
    throw FormatError(path + " is not a stepscope trace (bad or missing header)");
  std::memcpy(&c.major, d + 8, 2);
  std::memcpy(&c.minor, d + 10, 2);
  if (c.major != kFormatMajor)
    throw FormatError(path + " has format version " + std::to_string(c.major) + "." +
                      std::to_string(c.minor) + "; this stepscope reads version " +
                      std::to_string(kFormatMajor) + ".x");
  const uint32_t jlen = load32(d + 12);
  if (kFileHeaderFixed + size_t(jlen) > m.size)
    throw FormatError(path + " has a truncated header");
  c.header_json.assign(reinterpret_cast<const char*>(d + kFileHeaderFixed), jlen);

  // Pass 1: validate chunks and size the columns.
  std::vector<ChunkRef> chunks;
  size_t events = 0;
  size_t off = kFileHeaderFixed + jlen;
  while (off < m.size) {
    if (m.size - off < kChunkHeader) {
      c.warnings.push_back(path + ": truncated chunk header at offset " + std::to_string(off) +
                           " (the writer was interrupted); the rest is ignored");
      break;
    }
    if (load32(d + off) != kChunkMagic) {
      size_t next = resync(d, off + 1, m.size);
      c.warnings.push_back(path + ": corrupt data at offset " + std::to_string(off) +
                           ", skipped " + std::to_string(next - off) + " bytes");
      off = next;
      continue;
    }
    const uint8_t type = d[off + 4];
    const uint32_t len = load32(d + off + 8);
    const uint32_t crc = load32(d + off + 12);
    const size_t payload = off + kChunkHeader;
    if (len > kMaxChunkPayload || payload + len > m.size) {
      if (len <= kMaxChunkPayload) {
        c.warnings.push_back(path + ": truncated chunk at offset " + std::to_string(off) +
                             " (the writer was interrupted); the rest is ignored");
        break;
      }
      size_t next = resync(d, off + 1, m.size);
      c.warnings.push_back(path + ": corrupt chunk header at offset " + std::to_string(off) +
                           ", skipped " + std::to_string(next - off) + " bytes");
      off = next;
      continue;
    }
    c.valid_end = payload + len;
    chunks.push_back({type, payload, len, crc});
    off = payload + len;
  }
  const bool header_crc = c.minor >= kMinorHeaderCrc;  // 1.0-1.2: the payload only
  // A part is a contiguous run of the event chunks and one of the GPU chunks; every
  // other chunk (names, tracks, configs, stacks, stats) is read by every part.
  size_t n_events = 0, n_gpu = 0;
  for (const ChunkRef& ch : chunks) {
    n_events += ch.type == kChunkEvents;
    n_gpu += ch.type == kChunkGpu;
  }
  std::vector<bool> mine(chunks.size(), true);
  std::vector<EventChunk> event_chunks;
  auto in_part = [&](size_t i, size_t& nth, size_t n) {
    if (part_bytes > 0) return (chunks[i].offset - kChunkHeader) / part_bytes == part;
    return nth++ * parts / n == part;
  };
  for (size_t i = 0, ie = 0, ig = 0; i < chunks.size(); ++i) {
    if (chunks[i].type == kChunkEvents) {
      mine[i] = in_part(i, ie, n_events) && events_wanted;
    } else if (chunks[i].type == kChunkGpu) {
      mine[i] = in_part(i, ig, n_gpu);
      c.gpu_chunks += mine[i];
      mine[i] = mine[i] && gpu_wanted;
    }
    // Checksums of the chunks this part decodes only: a trace read a part at a time
    // would otherwise be checked whole for every part
    if (mine[i] && chunk_checksum(d, chunks[i], header_crc) != chunks[i].crc) {
      c.warnings.push_back(path + ": checksum mismatch in chunk at offset " +
                           std::to_string(chunks[i].offset - kChunkHeader) + ", chunk skipped");
      mine[i] = false;
    }
    if (chunks[i].type == kChunkEvents && mine[i]) {
      Cursor cur{d + chunks[i].offset, d + chunks[i].offset + chunks[i].len};
      cur.varint();
      // the rows it holds (at most its bytes: an event takes one at least)
      event_chunks.push_back({i, events, size_t(std::min<uint64_t>(cur.varint(), chunks[i].len)), 0});
      events += event_chunks.back().room;
    }
  }
  resize_events(c, events);

  // Pass 2: decode. Warnings per chunk, gathered in file order at the end.
  std::vector<std::vector<std::string>> chunk_warnings(chunks.size());
  decode_events(c, d, chunks, event_chunks, path, chunk_warnings);
  std::map<uint8_t, std::vector<size_t>> unknown;  // type -> offsets of the chunks skipped
  decode::Defined defined;
  const size_t before = c.warnings.size();
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!mine[i] || chunks[i].type == kChunkEvents) continue;
    const ChunkRef& ch = chunks[i];
    const uint8_t* p = d + ch.offset;
    Cursor cur{p, p + ch.len};
    const size_t noted = c.warnings.size();
    switch (ch.type) {
      case kChunkNames: {
        uint64_t n = cur.varint();
        for (uint64_t i = 0; i < n && cur.ok; ++i) {
          uint64_t id = cur.varint();
          uint64_t slen = cur.varint();
          std::string s = cur.bytes(size_t(slen));
          if (!cur.ok || !decode::within_reach(id, defined.names)) {
            c.warnings.push_back(path + ": malformed names chunk at offset " +
                                 std::to_string(ch.offset - kChunkHeader) + ", rest of chunk skipped");
            break;
          }
          decode::at_id(c.names, id) = std::move(s);
        }
        break;
      }
      case kChunkTrack: {
        TrackInfo t;
        t.id = cur.varint();
        t.tid = cur.varint();
        t.kind = cur.varint();
        t.name = cur.bytes(size_t(cur.varint()));
        if (t.kind != 0 && cur.p < cur.end) {  // GPU tracks (1.1) name their device and stream
          t.device = cur.varint();
          t.stream = cur.varint();
        }
        if (cur.ok) c.tracks.push_back(std::move(t));
        break;
      }
      case kChunkGpu:
        decode::gpu(c, p, ch.len, path, ch.offset - kChunkHeader);
        break;
      case kChunkLaunchConfigs: {
        uint64_t n = cur.varint();
        for (uint64_t i = 0; i < n && cur.ok; ++i) {
          uint64_t id = cur.varint();
          uint32_t v[9];
          for (uint32_t& x : v) x = uint32_t(cur.varint());
          if (!cur.ok || !decode::within_reach(id, defined.configs)) break;
          if (c.gpu.configs.size() < (id + 1) * 9) c.gpu.configs.resize((id + 1) * 9);
          std::copy(v, v + 9, c.gpu.configs.begin() + long(id * 9));
        }
        break;
      }
      case kChunkPyStacks:
        decode::pystacks(c, cur, path, ch.offset - kChunkHeader, defined);
        break;
      case kChunkPySamples:
        decode::pysamples(c, cur, path, ch.offset - kChunkHeader);
        break;
      case kChunkStats:
      case kChunkEnd: {
        uint64_t dropped = cur.varint();
        uint64_t written = cur.varint();
        if (cur.ok) {
          c.dropped = std::max(c.dropped, dropped);
          c.written = std::max(c.written, written);
        }
        if (ch.type == kChunkEnd) c.clean_close = true;
        break;
      }
      default:  // a newer minor version's chunk (or, in a 1.0-1.2 file, a damaged type byte)
        unknown[ch.type].push_back(ch.offset - kChunkHeader);
        break;
    }
    chunk_warnings[i].assign(c.warnings.begin() + long(noted), c.warnings.end());
    c.warnings.resize(noted);
  }
  c.warnings.resize(before);
  for (auto& w : chunk_warnings) c.warnings.insert(c.warnings.end(), w.begin(), w.end());
  warn_unknown_chunks(c, unknown, path);
  return c;
}

}  // namespace stepscope
