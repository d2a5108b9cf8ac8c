// Decodes one trace file into columns. Damage never aborts the read: a bad
// chunk is skipped with a warning naming the file and byte offset, a torn
// tail (a process killed mid-write) ends the read with a warning.
#pragma once
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace stepscope {

// An allocator whose resize() leaves numbers uninitialised: the event columns are sized
// for a part's rows and then filled by the decoders (zeroing them first was most of a
// read's time: page faults, and a pass over hundreds of MB).
template <typename T, typename A = std::allocator<T>>
struct DefaultInit : A {
  using traits = std::allocator_traits<A>;
  template <typename U>
  struct rebind {
    using other = DefaultInit<U, typename traits::template rebind_alloc<U>>;
  };
  using A::A;
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible<U>::value) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    traits::construct(static_cast<A&>(*this), p, std::forward<Args>(args)...);
  }
};
template <typename T>
using RowVector = std::vector<T, DefaultInit<T>>;

struct TrackInfo {
  uint64_t id;
  uint64_t tid;
  uint64_t kind;  // 0 CPU thread, 1 GPU stream, 2 CUDA API calls
  std::string name;
  uint64_t device = 0, stream = 0;  // GPU tracks
};

// GPU activity (format 1.1), one entry per record; see gpu.h for the fields.
struct GpuColumns {
  std::vector<uint8_t> type, sub, sub2;
  std::vector<uint32_t> device, stream, name, config, correlation, thread;
  std::vector<int64_t> start, end, bytes, track;
  // Launch configs, index = config id: grid xyz, block xyz, registers,
  // static and dynamic shared memory (9 values each, flattened).
  std::vector<uint32_t> configs;
};

// Python stack samples (format 1.2): per-process tables, index = id.
struct PyColumns {
  std::vector<std::string> strings;
  std::vector<uint32_t> frame_func, frame_file;  // string ids
  std::vector<int32_t> frame_line;
  std::vector<int32_t> stack_parent;  // -1 at the root
  std::vector<uint32_t> stack_frame;
  std::vector<int64_t> time, tid;  // one entry per sample
  std::vector<uint32_t> stack;
  int64_t interval_ns = 0;
};

struct Columns {
  RowVector<uint8_t> kind, cat;
  RowVector<uint32_t> name;
  RowVector<int64_t> track, start, end, arg;  // arg = -1 when absent
  RowVector<int32_t> step;
  RowVector<double> value;  // NaN unless a counter
  std::vector<std::string> names;  // index = name id
  std::vector<TrackInfo> tracks;
  GpuColumns gpu;
  PyColumns py;
  std::string header_json;
  uint16_t major = 0, minor = 0;
  uint64_t dropped = 0, written = 0;
  uint64_t valid_end = 0;  // file offset after the last complete chunk
  uint64_t gpu_chunks = 0;  // GPU chunks in the part read (decoded or not)
  bool clean_close = false;
  std::vector<std::string> warnings;
};

struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws FormatError when the file is not a readable stepscope trace at all.
// parts > 1: only the part-th of parts contiguous groups of the event chunks (and of
// the GPU chunks) is decoded, so a large trace can be read a piece at a time.
// part_bytes > 0 instead: the part-th part_bytes of the file (the event and GPU chunks
// that start there), parts that stay the same while a live trace grows.
// events/gpu false: those chunks of the part are neither checked nor decoded (a reader
// that takes a part's events and its GPU records at different times).
Columns read_trace(const std::string& path, uint32_t part = 0, uint32_t parts = 1, uint64_t part_bytes = 0,
                   bool events = true, bool gpu = true);

}  // namespace stepscope
