#include "metronome/base/process_memory.h"

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

}  // namespace

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
