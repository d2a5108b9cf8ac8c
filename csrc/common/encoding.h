// Varint (LEB128), zigzag and CRC-32C helpers used by writer and reader.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace stepscope {

inline void put_varint(std::string& out, uint64_t v) {
  char buf[10];
  int n = 0;
  while (v >= 0x80) {
    buf[n++] = char(v | 0x80);
    v >>= 7;
  }
  buf[n++] = char(v);
  out.append(buf, n);
}

inline uint64_t zigzag(int64_t v) { return (uint64_t(v) << 1) ^ uint64_t(v >> 63); }
inline int64_t unzigzag(uint64_t v) { return int64_t(v >> 1) ^ -int64_t(v & 1); }

// Bounds-checked decoding: `ok` turns false past `end` or on an over-long varint.
struct Cursor {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) break;
      uint8_t b = *p++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    ok = false;
    return 0;
  }
  uint8_t byte() {
    if (p >= end) { ok = false; return 0; }
    return *p++;
  }
  double f64() {
    double d = 0;
    if (end - p < 8) { ok = false; p = end; return 0; }
    std::memcpy(&d, p, 8);
    p += 8;
    return d;
  }
  std::string bytes(size_t n) {
    if (size_t(end - p) < n) { ok = false; p = end; return {}; }
    std::string s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
};

uint32_t crc32c(const void* data, size_t n);
// The CRC-32C of (bytes already summed to `crc`) followed by these: crc32c(a + b) ==
// crc32c_extend(crc32c(a), b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);

}  // namespace stepscope
