#include "metronome/base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "metronome/base/errors.h"

namespace metronome {

namespace {

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

void RequireRegular(const std::string& path, const struct stat& st) {
  if (!S_ISREG(st.st_mode)) {
    throw LoadError(path + ": not a regular file (it is " + std::string(FileKind(st.st_mode)) +
                    ")");
  }
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // stat() first: open() on a FIFO blocks until a writer appears, and a device may block or
  // never end. O_NONBLOCK covers a swap between the two calls (no effect on regular files).
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw LoadError(path + ": cannot open: " + ErrnoMessage(errno));
  }
  RequireRegular(path, st);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw LoadError(path + ": cannot open: " + ErrnoMessage(errno));
  }
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw LoadError(path + ": cannot stat: " + ErrnoMessage(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    RequireRegular(path, st);
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw LoadError(path + ": mmap failed: " + ErrnoMessage(err));
    }
    data_ = static_cast<const std::uint8_t*>(mapped);
  }
  ::close(fd);
}

void MappedFile::ReleasePages(const void* begin, std::size_t bytes) const noexcept {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<std::uintptr_t>(begin);
  const auto lo = reinterpret_cast<std::uintptr_t>(data_);
  if (data_ == nullptr || first < lo || first + bytes > lo + size_) return;
  const std::uintptr_t from = (first + page - 1) / page * page;
  const std::uintptr_t to = (first + bytes) / page * page;
  // Advice only: on failure the pages stay resident, which costs memory, not correctness.
  if (from >= to) return;
  // The mapping is this object's; the span only exposes it as const (as munmap below).
  auto* first_page = const_cast<std::uint8_t*>(data_) + (from - lo);
  (void)::madvise(first_page, to - from, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) {
    ::munmap(const_cast<std::uint8_t*>(data_), size_);
  }
}

}  // namespace metronome
