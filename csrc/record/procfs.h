// /proc text files for the system sampler (sampler.cc): a file kept open and
// re-read whole each sample, and the field and line splitting of its text.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace stepscope {
namespace procfs {

// A /proc file kept open and re-read from offset 0 each sample.
struct ProcFile {
  int fd = -1;
  std::string path;
  bool open_file(const std::string& p) {
    path = p;
    fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    return fd >= 0;
  }
  // Reads the whole file into buf; false if it cannot be read.
  bool read(std::string& buf) {
    if (fd < 0) return false;
    buf.resize(buf.capacity() < 8192 ? 8192 : buf.capacity());
    size_t used = 0;
    for (;;) {
      ssize_t n = ::pread(fd, &buf[used], buf.size() - used, off_t(used));
      if (n < 0) return false;
      used += size_t(n);
      if (n == 0 || used < buf.size()) break;
      buf.resize(buf.size() * 2);
    }
    buf.resize(used);
    return true;
  }
  void close_file() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

// Splits a line into whitespace-separated fields (no allocation beyond the vector).
inline void fields(const char* p, const char* end, std::vector<std::pair<const char*, size_t>>& out) {
  out.clear();
  while (p < end) {
    while (p < end && (*p == ' ' || *p == '\t')) ++p;
    const char* s = p;
    while (p < end && *p != ' ' && *p != '\t') ++p;
    if (p > s) out.emplace_back(s, size_t(p - s));
  }
}

inline double num(const std::pair<const char*, size_t>& f) { return std::strtod(f.first, nullptr); }

template <typename F>
void for_lines(const std::string& text, F&& fn) {
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', size_t(end - p)));
    const char* e = nl ? nl : end;
    fn(p, e);
    p = e + 1;
  }
}

}  // namespace procfs
}  // namespace stepscope
