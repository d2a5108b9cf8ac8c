// The Python sampler's interning (strings, frames, stacks: prefix trees), inline:
// both walks call it for every frame of every sample. The sampler thread only.
#pragma once
#include <cstring>

#include "record/pysampler_state.h"

namespace stepscope {
namespace pysampler {
// Internal linkage, as when they were one file's statics: each walk's file inlines its copy.
namespace {

inline uint32_t string_id(const char* s, size_t n) {
  std::string key(s, n);
  auto it = g_p.string_ids.find(key);
  if (it != g_p.string_ids.end()) return it->second;
  const uint32_t id = uint32_t(g_p.strings.size() + g_p.new_strings.size());
  g_p.new_strings.push_back(key);
  g_p.string_ids.emplace(std::move(key), id);
  return id;
}

inline uint32_t string_of(PyObject* o) {
  Py_ssize_t n = 0;
  const char* s = o && PyUnicode_Check(o) ? PyUnicode_AsUTF8AndSize(o, &n) : nullptr;
  if (!s) {
    PyErr_Clear();  // a name that is not valid UTF-8 (lone surrogates)
    return string_id("?", 1);
  }
  return string_id(s, size_t(n));
}

inline size_t frame_count() { return g_p.frames.size() + g_p.new_frames.size(); }

// The frame that stands for code the full tables have no room for (the slot kept for it).
inline uint32_t other_code_frame() {
  if (g_p.other_code == UINT32_MAX) {
    g_p.other_code = uint32_t(frame_count());
    g_p.new_frames.push_back({string_id(kOtherCode, std::strlen(kOtherCode)), string_id("", 0), 0});
  }
  return g_p.other_code;
}

// A new code object's index, or false where the code table is full.
inline bool new_code(uint32_t func, uint32_t file, uint32_t* ci) {
  if (g_p.code_names.size() >= kMaxCodes || frame_count() + 1 >= kMaxFrames) return false;
  *ci = uint32_t(g_p.code_names.size());
  g_p.code_names.push_back({func, file});
  return true;
}

// The frame id of code ci at instruction lasti; line_of(), which finds the line,
// runs once per distinct (code, instruction), not per sample.
template <typename LineOf>
inline uint32_t frame_at(uint32_t ci, int lasti, LineOf line_of) {
  const uint64_t at = (uint64_t(ci) << 32) | uint32_t(lasti);
  auto hit = g_p.offset_ids.find(at);
  if (hit != g_p.offset_ids.end()) return hit->second;
  const bool cache = g_p.offset_ids.size() < kMaxOffsets;
  const int line = line_of();
  const uint64_t k = (uint64_t(ci) << 32) | uint32_t(line);
  auto it = g_p.frame_ids.find(k);
  if (it != g_p.frame_ids.end()) {
    if (cache) g_p.offset_ids.emplace(at, it->second);
    return it->second;
  }
  if (frame_count() + 1 >= kMaxFrames) return other_code_frame();
  const CodeNames& names = g_p.code_names[ci];
  const uint32_t id = uint32_t(frame_count());
  g_p.new_frames.push_back({names.func, names.file, line});
  g_p.frame_ids.emplace(k, id);
  if (cache) g_p.offset_ids.emplace(at, id);
  return id;
}

// A stack's id, or -2 where the table is full (the sample is dropped and counted).
inline int64_t stack_id(int32_t parent, uint32_t frame) {
  const uint64_t k = (uint64_t(uint32_t(parent + 1)) << 32) | frame;
  auto it = g_p.stack_ids.find(k);
  if (it != g_p.stack_ids.end()) return it->second;
  const size_t n = g_p.stacks.size() + g_p.new_stacks.size();
  if (n >= kMaxStacks) return -2;
  g_p.new_stacks.emplace_back(parent, frame);
  g_p.stack_ids.emplace(k, uint32_t(n));
  return uint32_t(n);
}

// The stack id of frames ids[0..depth), innermost first; -2 where the table is full.
inline int64_t stack_of(const uint32_t* ids, int depth) {
  int64_t stack = -1;
  for (int i = depth - 1; i >= 0 && stack != -2; --i) stack = stack_id(int32_t(stack), ids[i]);
  return stack;
}

}  // namespace
}  // namespace pysampler
}  // namespace stepscope
