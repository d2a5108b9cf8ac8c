// On-disk format constants shared by the writer and the reader.
// The format is documented in docs/format.md; bump kFormatMinor for additive
// changes a v1 reader can skip, kFormatMajor for anything it cannot.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "common/encoding.h"

namespace stepscope {

constexpr char kFileMagic[8] = {'S', 'T', 'E', 'P', 'S', 'C', 'P', '\n'};
constexpr uint16_t kFormatMajor = 1;
constexpr uint16_t kFormatMinor = 4;  // 1.1: GPU activity (GPU, LAUNCH_CONFIGS chunks); 1.2: Python stack samples;
                                      // 1.3: the chunk CRC covers the chunk header too;
                                      // 1.4: `interrupted` step marks
// File header: magic[8] | u16 major | u16 minor | u32 json_len | json bytes.
constexpr uint32_t kFileHeaderFixed = 16;

// Chunk header: u32 magic | u8 type | u8 flags | u16 reserved | u32 len | u32 crc32c.
// From 1.3 the CRC covers type, flags, reserved and len, then the payload; before, the payload only.
constexpr uint32_t kChunkMagic = 0x4B4E4843;  // "CHNK" little-endian
constexpr uint32_t kChunkHeader = 16;
constexpr uint32_t kMaxChunkPayload = 64u << 20;  // sanity bound for the reader
constexpr uint16_t kMinorHeaderCrc = 3;  // first minor whose CRC covers the chunk header
constexpr uint32_t kChunkCrcFrom = 4, kChunkCrcHeaderBytes = 8;  // type .. len

enum ChunkType : uint8_t {
  kChunkNames = 1,   // interned strings: count, then (id, len, bytes)...
  kChunkTrack = 2,   // a thread, a GPU stream or a process's CUDA API calls
  kChunkEvents = 3,  // events of one track, delta/varint encoded
  kChunkStats = 4,   // cumulative counters: dropped, written
  kChunkEnd = 5,     // clean close; same payload as kChunkStats
  kChunkGpu = 6,     // 1.1: GPU activity of one track (gpu.cc)
  kChunkLaunchConfigs = 7,  // 1.1: kernel launch configurations, interned like names
  kChunkPyStacks = 8,   // 1.2: new strings, frames and stacks of the Python sampler (pysampler.cc)
  kChunkPySamples = 9,  // 1.2: Python stack samples: time, thread, stack id
};

// TRACK kinds.
enum TrackKind : uint8_t { kTrackThread = 0, kTrackGpuStream = 1, kTrackCudaApi = 2 };

// Event kinds (2 bits on disk).
enum Kind : uint8_t { kSpan = 0, kInstant = 1, kCounter = 2 };

// Categories (4 bits on disk). Names are fixed: readers map them to strings.
enum Category : uint8_t {
  kCatAnnotation = 0,  // user annotations (stepscope.annotate, smppy)
  kCatPhase = 1,       // GetNext, Forward, Loss, Backward, Optimizer, Recompute
  kCatStep = 2,        // step boundaries (instants named by mode)
  kCatOp = 3,          // framework ops
  kCatModule = 4,      // framework modules / layers
  kCatSystem = 5,      // system metrics
  kCatGpu = 6,         // GPU activity
  kCatCounter = 7,     // user counters
  kCatInternal = 8,    // stepscope's own bookkeeping
  kCatFramework = 9,   // framework-native annotations (e.g. Lightning actions)
  kNumCategories = 16,
};

// Event byte 0: kind (bits 0-1) | category (bits 2-5) | has_arg (bit 6) | int_value (bit 7).
constexpr uint8_t kHasArg = 1u << 6;
constexpr uint8_t kIntValue = 1u << 7;

// The CRC of a chunk (1.3): its header's type, flags, reserved and length fields, then
// its payload; a flipped type or length bit is caught like a flipped payload bit.
inline uint32_t chunk_crc(const uint8_t* header, const void* payload, size_t len) {
  return crc32c_extend(crc32c(header + kChunkCrcFrom, kChunkCrcHeaderBytes), payload, len);
}

// Fills the kChunkHeader bytes at `h` for a chunk of `type` whose payload follows: the
// one place a writer builds a chunk header.
inline void write_chunk_header(char* h, uint8_t type, const char* payload, uint32_t len) {
  const uint32_t magic = kChunkMagic;
  std::memcpy(h, &magic, 4);
  h[4] = char(type);
  h[5] = h[6] = h[7] = 0;  // flags, reserved
  std::memcpy(h + 8, &len, 4);
  const uint32_t crc = chunk_crc(reinterpret_cast<const uint8_t*>(h), payload, len);
  std::memcpy(h + 12, &crc, 4);
}

// A whole chunk (header, then the payload) appended to `out`: for writers that build a
// payload first (GPU records, Python samples).
inline void append_chunk(std::string& out, uint8_t type, const std::string& payload) {
  char h[kChunkHeader];
  write_chunk_header(h, type, payload.data(), uint32_t(payload.size()));
  out.append(h, kChunkHeader);
  out += payload;
}

}  // namespace stepscope
