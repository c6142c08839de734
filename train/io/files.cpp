// train/io/files.cpp — synced whole-file I/O (train/io/files.h).
#include "train/io/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace ffn::train {

namespace {
void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      FFN_THROW("[checkpoint] writing '", path, "' failed: ", std::strerror(err));
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
}
}  // namespace

void write_file_synced(const std::string& path, const std::string& a, const std::string& b) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  FFN_CHECK(fd >= 0, "[checkpoint] cannot create '", path, "': ", std::strerror(errno));
  write_all(fd, a.data(), a.size(), path);
  write_all(fd, b.data(), b.size(), path);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    FFN_THROW("[checkpoint] fsync '", path, "' failed: ", std::strerror(err));
  }
  ::close(fd);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FFN_CHECK(in.good(), "[checkpoint] cannot open '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace ffn::train
