// This process's memory as the kernel accounts it (Linux /proc/self/status): resident set size now
// and its high-water mark. Used to check that a memory-mapped model stays near its file size.
// And the memory still available to it: the machine's MemAvailable (/proc/meminfo) or, inside a
// memory-limited cgroup, the limit minus the group's usage, whichever is smaller (what serve sizes
// its default KV pool from).
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

// MemAvailable of a /proc/meminfo text, bytes; nullopt if missing or malformed.
[[nodiscard]] std::optional<std::int64_t> ParseMemAvailable(std::string_view meminfo_text);

// A cgroup memory file holding one byte count: v2's memory.max / memory.current or v1's
// memory.limit_in_bytes / memory.usage_in_bytes ("123456\n"). nullopt for "max" (v2: no limit), a
// v1 "no limit" (any value >= 2^62; the kernel writes PAGE_COUNTER_MAX * page size) and junk.
[[nodiscard]] std::optional<std::int64_t> ParseCgroupBytes(std::string_view text);

// Bytes available to this process: mem_available_bytes, or the cgroup's limit - usage when both
// are known and smaller (0 when usage exceeds the limit). Pure, for the reader and its tests.
[[nodiscard]] std::int64_t AvailableMemoryBytes(std::int64_t mem_available_bytes,
                                                std::optional<std::int64_t> cgroup_limit_bytes,
                                                std::optional<std::int64_t> cgroup_usage_bytes);

// AvailableMemoryBytes from /proc/meminfo and this process's cgroup (v2 at /sys/fs/cgroup, else
// v1's memory controller there); nullopt where /proc/meminfo cannot be read (not Linux).
[[nodiscard]] std::optional<std::int64_t> ReadAvailableMemoryBytes();

}  // namespace metronome::base
