// The trace reader's chunk decoders (decoders.cc), and the id tables' bounds that
// they and the reader's own chunk loop (reader.cc) share.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/encoding.h"
#include "read/reader.h"

namespace stepscope {
namespace decode {

// Ids of interned tables (names, launch configs, Python strings, frames, stacks) are
// dense from 0, so a table is a vector indexed by id. An id far beyond the entries
// defined so far (counted as read, not as the table's size, which gaps inflate) is
// damage: refusing it keeps a table's memory within a constant factor of what the
// file defines, whatever the id.
constexpr uint64_t kIdSlack = 1u << 16;
inline bool within_reach(uint64_t id, uint64_t& defined) {
  if (id >= 2 * defined + kIdSlack) return false;
  ++defined;
  return true;
}

// Entries each table has been given so far (within_reach's measure).
struct Defined {
  uint64_t names = 0, configs = 0, strings = 0, frames = 0, stacks = 0;
};

// A table grows to hold `id`; the entries skipped (defined by a lost chunk) get `fill`.
template <typename T>
inline T& at_id(std::vector<T>& v, uint64_t id, const T& fill = T()) {
  if (v.size() <= id) v.resize(id + 1, fill);
  return v[id];
}

// One events chunk's records into the columns (sized already) from row `base` on, at most
// `room` of them; returns how many it decoded (fewer at damage, with a warning naming
// path and offset). Chunks write disjoint rows: several decode at once.
uint64_t events_at(Columns& c, size_t base, uint64_t room, const uint8_t* p, uint32_t len, const std::string& path,
                   size_t offset, std::vector<std::string>& warnings);
// Each appends one chunk's records to the columns, warning (path, offset) at damage.
void gpu(Columns& c, const uint8_t* p, uint32_t len, const std::string& path, size_t offset);
void pystacks(Columns& c, Cursor& cur, const std::string& path, size_t offset, Defined& defined);
void pysamples(Columns& c, Cursor& cur, const std::string& path, size_t offset);

}  // namespace decode
}  // namespace stepscope
