// Decodes one trace file into columns. Damage never aborts the read: a bad
// chunk is skipped with a warning naming the file and byte offset, a torn
// tail (a process killed mid-write) ends the read with a warning.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace stepscope {

struct TrackInfo {
  uint64_t id;
  uint64_t tid;
  uint64_t kind;
  std::string name;
};

struct Columns {
  std::vector<uint8_t> kind, cat;
  std::vector<uint32_t> name;
  std::vector<int64_t> track, start, end, arg;  // arg = -1 when absent
  std::vector<int32_t> step;
  std::vector<double> value;  // NaN unless a counter
  std::vector<std::string> names;  // index = name id
  std::vector<TrackInfo> tracks;
  std::string header_json;
  uint16_t major = 0, minor = 0;
  uint64_t dropped = 0, written = 0;
  bool clean_close = false;
  std::vector<std::string> warnings;
};

struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws FormatError when the file is not a readable stepscope trace at all.
Columns read_trace(const std::string& path);

}  // namespace stepscope
