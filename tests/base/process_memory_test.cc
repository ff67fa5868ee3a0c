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

constexpr const char* kMeminfo =
    "MemTotal:       24576000 kB\n"
    "MemFree:        17000000 kB\n"
    "MemAvailable:   21000000 kB\n"
    "Buffers:          100000 kB\n";

TEST(AvailableMemoryTest, ParsesMemAvailableAsBytes) {
  EXPECT_EQ(ParseMemAvailable(kMeminfo), 21000000LL * 1024);
  EXPECT_FALSE(ParseMemAvailable("MemTotal: 1 kB\nMemFree: 1 kB\n").has_value());
  EXPECT_FALSE(ParseMemAvailable("MemAvailable: lots kB\n").has_value());
}

TEST(AvailableMemoryTest, ParsesCgroupByteCounts) {
  EXPECT_EQ(ParseCgroupBytes("8589934592\n"), 8589934592LL);
  EXPECT_EQ(ParseCgroupBytes("0\n"), 0);
  EXPECT_FALSE(ParseCgroupBytes("max\n").has_value());                  // v2: no limit
  EXPECT_FALSE(ParseCgroupBytes("9223372036854771712\n").has_value());  // v1: no limit
  EXPECT_FALSE(ParseCgroupBytes("12 34\n").has_value());
  EXPECT_FALSE(ParseCgroupBytes("-5\n").has_value());
  EXPECT_FALSE(ParseCgroupBytes("").has_value());
}

TEST(AvailableMemoryTest, TheCgroupHeadroomWinsWhereItIsSmaller) {
  constexpr std::int64_t kGiB = std::int64_t{1} << 30;
  EXPECT_EQ(AvailableMemoryBytes(20 * kGiB, std::nullopt, std::nullopt), 20 * kGiB);
  EXPECT_EQ(AvailableMemoryBytes(20 * kGiB, 8 * kGiB, 3 * kGiB), 5 * kGiB);
  EXPECT_EQ(AvailableMemoryBytes(4 * kGiB, 8 * kGiB, 3 * kGiB), 4 * kGiB);
  EXPECT_EQ(AvailableMemoryBytes(4 * kGiB, 8 * kGiB, 9 * kGiB), 0);  // over its limit
  EXPECT_EQ(AvailableMemoryBytes(4 * kGiB, 8 * kGiB, std::nullopt), 4 * kGiB);
}

TEST(AvailableMemoryTest, ReadsThisMachine) {
  const auto bytes = ReadAvailableMemoryBytes();
  if (!bytes.has_value()) GTEST_SKIP() << "no /proc/meminfo here";
  EXPECT_GT(*bytes, 0);
}

}  // namespace
}  // namespace metronome::base
