// Read-only memory mapping of a whole file. Thread-safe after construction (immutable).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace metronome {

class MappedFile {
 public:
  // Throws LoadError naming `path` if it is not a regular file (a FIFO, device, directory or
  // socket is refused before it is opened, so nothing blocks) or cannot be opened or mapped. An
  // empty file maps to an empty span. Every model and tokenizer file is read through this.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  [[nodiscard]] std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  [[nodiscard]] const std::string& path() const { return path_; }
  // Drops the whole pages inside [begin, begin + bytes) (a range of bytes()) from this process's
  // resident memory, for data that has been copied out and will not be read here again; a later
  // read maps them in again from the file. Pages the range covers only in part stay.
  void ReleasePages(const void* begin, std::size_t bytes) const noexcept;

 private:
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace metronome
