// Interned names: the process-wide, bounded table of the names events carry as ids.
#include "record/buffers.h"

namespace stepscope {

std::mutex g_names_mu;
std::vector<std::string> g_names;
std::atomic<uint64_t> g_names_folded{0};  // lookups folded since the trace opened
namespace {
std::unordered_map<std::string, uint32_t> g_name_ids;
size_t g_name_bytes = 0;                       // the text held in g_names
std::atomic<uint64_t> g_names_count{0};        // g_names.size(), read without the lock
uint32_t g_overflow_id = UINT32_MAX;           // kOverflowName's id, once a name was folded
}  // namespace

// The table lives as long as the process (ids stay valid across sessions), so it
// is bounded: past kMaxNames names or kMaxNameBytes of text, a new name is
// recorded as kOverflowName and counted, and memory stays flat whatever a
// program names (a name per item, per request, per generated op).
uint32_t intern(const std::string& s, bool* folded) {
  std::lock_guard<std::mutex> lk(g_names_mu);
  auto it = g_name_ids.find(s);
  if (it != g_name_ids.end()) {
    if (folded) *folded = false;
    return it->second;
  }
  const bool full = g_names.size() + 1 >= kMaxNames || g_name_bytes + s.size() > kMaxNameBytes;
  if (full) {
    if (g_overflow_id == UINT32_MAX) {  // the slot kept for it
      g_overflow_id = uint32_t(g_names.size());
      g_names.emplace_back(kOverflowName);
      g_name_ids.emplace(kOverflowName, g_overflow_id);
      g_names_count.store(g_names.size(), std::memory_order_release);
    }
    g_names_folded.fetch_add(1, std::memory_order_relaxed);
    if (folded) *folded = true;
    return g_overflow_id;
  }
  if (folded) *folded = false;
  uint32_t id = uint32_t(g_names.size());
  g_names.push_back(s);
  g_name_bytes += s.size();
  g_name_ids.emplace(s, id);
  g_names_count.store(g_names.size(), std::memory_order_release);
  return id;
}

// Ids are dense from 0: one compare, no lock (the entry points that take an id check it).
bool is_interned(uint64_t id) { return id < g_names_count.load(std::memory_order_acquire); }

}  // namespace stepscope
