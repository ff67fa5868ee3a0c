#include "metronome/base/process_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

namespace metronome::base {
namespace {

constexpr const char* kStatus =
    "Name:\tmetronome\n"
    "VmPeak:\t  812344 kB\n"
    "VmHWM:\t  204800 kB\n"
    "VmRSS:\t  102400 kB\n"
    "Threads:\t2\n";

TEST(ProcessMemoryTest, ParsesKilobyteFieldsAsBytes) {
  const auto m = ParseProcessStatus(kStatus);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->rss_bytes, 102400LL * 1024);
  EXPECT_EQ(m->hwm_bytes, 204800LL * 1024);
}

TEST(ProcessMemoryTest, RejectsMissingOrMalformedFields) {
  EXPECT_FALSE(ParseProcessStatus("VmRSS:\t 1 kB\n").has_value());  // no VmHWM
  EXPECT_FALSE(ParseProcessStatus("VmRSS:\t x kB\nVmHWM:\t 1 kB\n").has_value());
  EXPECT_FALSE(ParseProcessStatus("VmRSS:\t 1 MB\nVmHWM:\t 1 kB\n").has_value());
  // A longer key with the same prefix is not the field.
  EXPECT_FALSE(ParseProcessStatus("VmRSSx:\t 1 kB\nVmHWM:\t 1 kB\n").has_value());
  EXPECT_FALSE(ParseProcessStatus("").has_value());
}

TEST(ProcessMemoryTest, TouchedMemoryRaisesTheResidentSet) {
  const auto before = ReadProcessMemory();
  if (!before.has_value()) GTEST_SKIP() << "no /proc/self/status here";
  constexpr std::size_t kBytes = 64u << 20;
  const std::unique_ptr<char[]> block(new char[kBytes]);
  std::memset(block.get(), 1, kBytes);  // every page touched: resident
  const auto after = ReadProcessMemory();
  ASSERT_TRUE(after.has_value());
  // At least half of the touched pages are counted (the rest of the process may have shrunk).
  EXPECT_GE(after->rss_bytes - before->rss_bytes, static_cast<std::int64_t>(kBytes / 2));
  EXPECT_GE(after->hwm_bytes, after->rss_bytes);
  EXPECT_EQ(block[kBytes - 1], 1);
}

}  // namespace
}  // namespace metronome::base
