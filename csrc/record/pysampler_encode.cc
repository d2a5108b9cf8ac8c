// The Python sampler's chunks (docs/format.md): what the writer thread takes from
// its queue every flush, as PYSTACKS (new strings, frames, stacks) and PYSAMPLES.
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>  // PyFrame_GetBack: Python.h declares it only from 3.11
#endif

#include "common/encoding.h"
#include "common/format.h"
#include "record/pysampler.h"
#include "record/pysampler_state.h"
#include "record/recorder.h"

namespace stepscope {

using pysampler::Frame;
using pysampler::Sample;
using pysampler::g_p;

// PYSTACKS: first string id, count, (len, bytes)...; first frame id, count,
// (function, file, line)...; first stack id, count, (parent + 1, frame)...
// PYSAMPLES: interval_ns, count, thread count, OS thread ids..., base_ns, then
// per sample zigzag(time - previous time), thread index, stack id.
void encode_pysamples(std::string& out) {
  std::vector<std::string> strings;
  std::vector<Frame> frames;
  std::vector<std::pair<int32_t, uint32_t>> stacks;
  std::vector<Sample> samples;
  size_t s0, f0, k0;
  int hz;
  {
    std::lock_guard<std::mutex> lk(g_p.mu);
    hz = g_p.hz;
  }
  {
    std::lock_guard<std::mutex> dl(g_p.data_mu);
    if (g_p.samples.empty() && g_p.strings_written == g_p.strings.size() &&
        g_p.frames_written == g_p.frames.size() && g_p.stacks_written == g_p.stacks.size())
      return;
    s0 = g_p.strings_written;
    f0 = g_p.frames_written;
    k0 = g_p.stacks_written;
    strings.assign(g_p.strings.begin() + long(s0), g_p.strings.end());
    frames.assign(g_p.frames.begin() + long(f0), g_p.frames.end());
    stacks.assign(g_p.stacks.begin() + long(k0), g_p.stacks.end());
    g_p.strings_written = g_p.strings.size();
    g_p.frames_written = g_p.frames.size();
    g_p.stacks_written = g_p.stacks.size();
    samples.swap(g_p.samples);
  }
  const size_t before = out.size();
  if (!strings.empty() || !frames.empty() || !stacks.empty()) {
    std::string p;
    put_varint(p, s0);
    put_varint(p, strings.size());
    for (const std::string& s : strings) {
      put_varint(p, s.size());
      p += s;
    }
    put_varint(p, f0);
    put_varint(p, frames.size());
    for (const Frame& f : frames) {
      put_varint(p, f.func);
      put_varint(p, f.file);
      put_varint(p, zigzag(f.line));
    }
    put_varint(p, k0);
    put_varint(p, stacks.size());
    for (const auto& [parent, frame] : stacks) {
      put_varint(p, uint64_t(int64_t(parent) + 1));
      put_varint(p, frame);
    }
    append_chunk(out, kChunkPyStacks, p);
  }
  if (!samples.empty()) {
    std::vector<uint64_t> tids;
    std::unordered_map<uint64_t, uint32_t> index;
    for (const Sample& s : samples)
      if (index.emplace(s.tid, uint32_t(tids.size())).second) tids.push_back(s.tid);
    std::string p;
    p.reserve(samples.size() * 5 + tids.size() * 4 + 32);
    put_varint(p, uint64_t(1000000000 / (hz > 0 ? hz : 100)));
    put_varint(p, samples.size());
    put_varint(p, tids.size());
    for (uint64_t t : tids) put_varint(p, t);
    int64_t prev = converter().to_ns(samples[0].tick);
    put_varint(p, zigzag(prev));
    for (const Sample& s : samples) {
      const int64_t ns = converter().to_ns(s.tick);
      put_varint(p, zigzag(ns - prev));
      prev = ns;
      put_varint(p, index[s.tid]);
      put_varint(p, s.stack);
    }
    append_chunk(out, kChunkPySamples, p);
  }
  std::lock_guard<std::mutex> dl(g_p.data_mu);
  g_p.bytes += out.size() - before;
}

}  // namespace stepscope