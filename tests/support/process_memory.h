// The test process' own memory, for tests that assert nothing is left behind (no timing: a size).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>

namespace metronome::testing {

// Resident set size in bytes (/proc/self/statm, second field, in pages); 0 if unreadable.
inline std::int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size_pages = 0;
  std::int64_t resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<std::int64_t>(::sysconf(_SC_PAGESIZE));
}

// Under AddressSanitizer freed memory sits in a quarantine and RSS says nothing about leaks
// (LeakSanitizer checks those at exit instead).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kRssIsMeaningful = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kRssIsMeaningful = false;
#else
inline constexpr bool kRssIsMeaningful = true;
#endif
#else
inline constexpr bool kRssIsMeaningful = true;
#endif

}  // namespace metronome::testing
