// This process's memory as the kernel accounts it (Linux /proc/self/status): resident set size now
// and its high-water mark. Used to check that a memory-mapped model stays near its file size.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace metronome::base {

struct ProcessMemory {
  std::int64_t rss_bytes = 0;  // VmRSS: resident now (file-backed mapped pages included)
  std::int64_t hwm_bytes = 0;  // VmHWM: peak resident since the process started
};

// Parses the text of a /proc/<pid>/status file; nullopt if VmRSS or VmHWM is missing or malformed.
[[nodiscard]] std::optional<ProcessMemory> ParseProcessStatus(std::string_view status_text);

// This process's figures; nullopt where /proc/self/status cannot be read (not Linux).
[[nodiscard]] std::optional<ProcessMemory> ReadProcessMemory();

}  // namespace metronome::base
