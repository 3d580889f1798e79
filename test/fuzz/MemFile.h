//===- MemFile.h - An in-memory file with a path, for fuzz targets -*- C++ -*-===//
//
// The loaders under test take a path (they stat, open and read it, as they
// do for a user's file). A memfd gives them one without touching the disk:
// /proc/self/fd/N names the bytes of the current input.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TEST_FUZZ_MEMFILE_H
#define KILN_TEST_FUZZ_MEMFILE_H

#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace kiln::fuzz {

class MemFile {
public:
  MemFile() {
    fd_ = memfd_create("kiln-fuzz", 0);
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { close(fd_); }
  /// Replaces the file's contents with `size` bytes of `data`.
  const std::string &set(const void *data, size_t size) {
    if (ftruncate(fd_, 0) != 0 || pwrite(fd_, data, size, 0) != ssize_t(size)) {
      std::perror("memfd write");
      std::abort();
    }
    return path_;
  }
  const std::string &path() const { return path_; }

private:
  int fd_ = -1;
  std::string path_;
};

} // namespace kiln::fuzz

#endif // KILN_TEST_FUZZ_MEMFILE_H
