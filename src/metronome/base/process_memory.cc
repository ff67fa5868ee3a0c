#include "metronome/base/process_memory.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <string>

namespace metronome::base {
namespace {

// The value of a "Key:   1234 kB" line, in bytes; nullopt if the key is absent or malformed.
std::optional<std::int64_t> KilobytesField(std::string_view text, std::string_view key) {
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t eol = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, eol - at);
    at = eol + 1;
    if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ':') {
      continue;
    }
    std::string_view rest = line.substr(key.size() + 1);
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    std::int64_t kb = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), kb);
    if (ec != std::errc() || kb < 0) return std::nullopt;
    const std::string_view unit(end, static_cast<std::size_t>(rest.data() + rest.size() - end));
    if (unit != " kB") return std::nullopt;
    return kb * 1024;
  }
  return std::nullopt;
}

// The whole file, or nullopt when it cannot be opened.
std::optional<std::string> ReadText(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::optional<std::int64_t> CgroupFile(const char* path) {
  const std::optional<std::string> text = ReadText(path);
  return text ? ParseCgroupBytes(*text) : std::nullopt;
}

}  // namespace

std::optional<std::int64_t> ParseMemAvailable(std::string_view meminfo_text) {
  return KilobytesField(meminfo_text, "MemAvailable");
}

std::optional<std::int64_t> ParseCgroupBytes(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  // cgroup v1 reports "no limit" as PAGE_COUNTER_MAX pages, about 2^63 bytes.
  constexpr std::int64_t kNoLimitAtOrAbove = std::int64_t{1} << 62;
  std::int64_t bytes = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), bytes);
  if (ec != std::errc() || end != text.data() + text.size() || bytes < 0 ||
      bytes >= kNoLimitAtOrAbove) {
    return std::nullopt;  // "max", junk, or no limit
  }
  return bytes;
}

std::int64_t AvailableMemoryBytes(std::int64_t mem_available_bytes,
                                  std::optional<std::int64_t> cgroup_limit_bytes,
                                  std::optional<std::int64_t> cgroup_usage_bytes) {
  if (!cgroup_limit_bytes || !cgroup_usage_bytes) return mem_available_bytes;
  const std::int64_t headroom =
      std::max<std::int64_t>(0, *cgroup_limit_bytes - *cgroup_usage_bytes);
  return std::min(mem_available_bytes, headroom);
}

std::optional<std::int64_t> ReadAvailableMemoryBytes() {
  const std::optional<std::string> meminfo = ReadText("/proc/meminfo");
  if (!meminfo) return std::nullopt;
  const std::optional<std::int64_t> available = ParseMemAvailable(*meminfo);
  if (!available) return std::nullopt;
  std::optional<std::int64_t> limit = CgroupFile("/sys/fs/cgroup/memory.max");
  std::optional<std::int64_t> usage = CgroupFile("/sys/fs/cgroup/memory.current");
  if (!limit) {
    limit = CgroupFile("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    usage = CgroupFile("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  return AvailableMemoryBytes(*available, limit, usage);
}

std::optional<ProcessMemory> ParseProcessStatus(std::string_view status_text) {
  const auto rss = KilobytesField(status_text, "VmRSS");
  const auto hwm = KilobytesField(status_text, "VmHWM");
  if (!rss || !hwm) return std::nullopt;
  return ProcessMemory{*rss, *hwm};
}

std::optional<ProcessMemory> ReadProcessMemory() {
  std::ifstream in("/proc/self/status");
  if (!in) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseProcessStatus(text);
}

}  // namespace metronome::base
