#include "metronome/base/streamed_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace metronome::base {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(StreamedMemoryTest, SizesRoundToLinesBelowAHugePageAndToHugePagesFromOne) {
  struct Case {
    std::size_t bytes, huge, want;
  };
  const Case cases[] = {
      {0, 2 * kMiB, 64},                   // nothing still gets a line
      {1, 2 * kMiB, 64},                   //
      {64, 2 * kMiB, 64},                  //
      {65, 2 * kMiB, 128},                 //
      {2 * kMiB - 1, 2 * kMiB, 2 * kMiB},  // under one huge page: lines (a multiple of 64)
      {2 * kMiB, 2 * kMiB, 2 * kMiB},      // one huge page
      {2 * kMiB + 1, 2 * kMiB, 4 * kMiB},  // waste under one huge page
      {137 * kMiB + 5, 2 * kMiB, 138 * kMiB},
      {3 * kMiB, 0, 3 * kMiB},               // no transparent huge pages: lines
      {3 * kMiB + 1, 0, 3 * kMiB + 64},      //
      {600 * kMiB, 512 * kMiB, 600 * kMiB},  // arm64's 512 MiB pages are not used
      {40 * kMiB, 32 * kMiB, 64 * kMiB},     // arm64's 32 MiB pages are
  };
  for (const Case& c : cases) {
    EXPECT_EQ(StreamedAllocationBytes(c.bytes, c.huge), c.want)
        << "bytes " << c.bytes << " huge page " << c.huge;
  }
}

TEST(StreamedMemoryTest, LargeBuffersAreHugePageAlignedAndAdvised) {
  const std::size_t huge = TransparentHugePageBytes();
  const std::size_t bytes = 3 * (huge > 0 ? huge : 2 * kMiB) + 12345;
  const StreamedBuffer buffer = AllocateStreamed(bytes);
  ASSERT_NE(buffer, nullptr);
  std::byte* p = buffer.get();
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  EXPECT_EQ(address % 64, 0u);
  if (huge >= 4096 && huge <= 32 * kMiB) {
    EXPECT_EQ(address % huge, 0u) << "huge page " << huge;
  }
  // The whole size is usable (written and read back at both ends).
  auto* bytes_p = reinterpret_cast<unsigned char*>(p);
  std::memset(bytes_p, 0xA5, bytes);
  EXPECT_EQ(bytes_p[0], 0xA5);
  EXPECT_EQ(bytes_p[bytes - 1], 0xA5);
  // Where the kernel offers transparent huge pages for advised memory, the mapping says so
  // (smaps "VmFlags: ... hg": MADV_HUGEPAGE applied to the range).
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode((std::istreambuf_iterator<char>(enabled)), std::istreambuf_iterator<char>());
  if (huge > 0 &&
      (mode.find("[madvise]") != std::string::npos || mode.find("[always]") != std::string::npos)) {
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool in_range = false;
    bool advised = false;
    while (std::getline(smaps, line)) {
      std::uintptr_t lo = 0;
      std::uintptr_t hi = 0;
      char dash = 0;
      std::istringstream head(line);
      if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
        in_range = lo <= address && address < hi;
      } else if (in_range && line.rfind("VmFlags:", 0) == 0) {
        advised = line.find(" hg") != std::string::npos;
      }
    }
    EXPECT_TRUE(advised) << "MADV_HUGEPAGE not recorded on the buffer's mapping";
  }
}

TEST(StreamedMemoryTest, SmallBuffersAreLineAligned) {
  const StreamedBuffer p = AllocateStreamed(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.get()) % 64, 0u);
  std::memset(p.get(), 0, 1000);
}

}  // namespace
}  // namespace metronome::base
