// Locating ../shared/models (real pretrained models and reference outputs) from tests. ctest sets
// METRONOME_SHARED_DIR; run by hand, the path beside the source checkout is tried. Tests that need
// a file call SharedModelPath() and GTEST_SKIP() when it returns an empty string, so the suite
// still runs (and says what it skipped) on a checkout without shared/.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace metronome::testing {

inline std::string SharedModelPath(const std::string& file) {
  namespace fs = std::filesystem;
  std::string dirs[2];
  if (const char* env = std::getenv("METRONOME_SHARED_DIR")) {
    dirs[0] = env;
  }
  dirs[1] = METRONOME_SOURCE_DIR "/../shared";
  for (const auto& dir : dirs) {
    if (dir.empty()) continue;
    const fs::path p = fs::path(dir) / "models" / file;
    if (fs::exists(p)) return p.string();
  }
  return "";
}

}  // namespace metronome::testing
