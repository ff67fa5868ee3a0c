// Little-endian binary writing and bounds-checked reading, for the formats the project defines
// itself (a moved session's state). The reader never reads past its span: every Get answers false
// once the bytes run out, and a reader that failed stays failed, so a decoder checks ok() once at
// the end of a group of reads instead of after each one. Integers are stored little-endian
// whatever the host, floats as their IEEE-754 bits.
//
// Thread-safety: a writer or a reader is used by one thread.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace metronome::base {

// The unsigned integer of T's size: what a value is stored as.
template <typename T>
using BitsOf = std::conditional_t<
    sizeof(T) == 1, std::uint8_t,
    std::conditional_t<sizeof(T) == 2, std::uint16_t,
                       std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;

// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), as zlib's crc32(): detects a corrupted
// blob, not a forged one.
[[nodiscard]] std::uint32_t Crc32(std::span<const std::byte> bytes) noexcept;

class ByteWriter {
 public:
  template <typename T>
  requires std::is_arithmetic_v<T>
  void Put(T value) {
    using U = BitsOf<T>;
    const U bits = std::bit_cast<U>(value);
    for (std::size_t i = 0; i < sizeof(U); ++i) {
      bytes_.push_back(static_cast<std::byte>((bits >> (8 * i)) & 0xFFu));
    }
  }
  void PutBytes(std::span<const std::byte> data) {
    bytes_.insert(bytes_.end(), data.begin(), data.end());
  }
  // A u32 length, then the bytes.
  void PutString(std::string_view s) {
    Put(static_cast<std::uint32_t>(s.size()));
    PutBytes(std::as_bytes(std::span<const char>(s.data(), s.size())));
  }
  [[nodiscard]] const std::vector<std::byte>& bytes() const { return bytes_; }
  [[nodiscard]] std::vector<std::byte> Take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> bytes) : bytes_(bytes) {}

  template <typename T>
  requires std::is_arithmetic_v<T>
  bool Get(T* value) {
    using U = BitsOf<T>;
    if (!Need(sizeof(U))) return false;
    U bits = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i) {
      bits |= static_cast<U>(static_cast<U>(bytes_[pos_ + i]) << (8 * i));
    }
    pos_ += sizeof(U);
    *value = std::bit_cast<T>(bits);
    return true;
  }
  // The next n bytes (a view into the reader's span); empty and failed when fewer remain.
  std::span<const std::byte> GetBytes(std::size_t n) {
    if (!Need(n)) return {};
    const auto out = bytes_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  // PutString's form; at most max_bytes long.
  bool GetString(std::string* s, std::size_t max_bytes) {
    std::uint32_t n = 0;
    if (!Get(&n)) return false;
    if (n > max_bytes) {
      ok_ = false;
      return false;
    }
    const auto b = GetBytes(n);
    if (!ok_) return false;
    s->assign(reinterpret_cast<const char*>(b.data()), b.size());
    return true;
  }
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] std::size_t remaining() const { return ok_ ? bytes_.size() - pos_ : 0; }
  [[nodiscard]] std::size_t position() const { return pos_; }

 private:
  bool Need(std::size_t n) {
    if (!ok_ || bytes_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    return true;
  }
  std::span<const std::byte> bytes_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace metronome::base
