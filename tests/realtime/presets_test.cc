#include "metronome/realtime/presets.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "metronome/base/errors.h"

namespace metronome::realtime {
namespace {

TEST(Presets, NamesAreUnique) {
  std::set<std::string> names;
  for (const SimPreset& p : BuiltinPresets()) {
    EXPECT_TRUE(names.insert(p.name).second) << p.name;
  }
}

TEST(Presets, EveryPresetHasPositiveCostsAndAPoolForOneSession) {
  for (const SimPreset& p : BuiltinPresets()) {
    SCOPED_TRACE(p.name);
    EXPECT_GT(p.cost.c0_s, 0.0);
    EXPECT_GT(p.cost.c1_s_per_token, 0.0);
    EXPECT_GT(p.cost.c2_s_per_kv_token, 0.0);
    EXPECT_GT(p.kv_bytes_per_token, 0.0);
    EXPECT_FALSE(p.assumed.empty());
    // One session at its default window (plus the sinks) fits the pool.
    const std::int64_t session_blocks =
        (p.window_tokens + p.sinks + p.block_tokens - 1) / p.block_tokens;
    EXPECT_GE(p.PoolBlocks(), session_blocks);
  }
}

// The CPU presets keep their GPU sibling's session shape and KV bytes, change the cost and the
// pool, and say which command produced the cost.
TEST(Presets, CpuPresetsAreCalibratedSiblingsOfTheGpuOnes) {
  const std::pair<const char*, const char*> pairs[] = {
      {"minicpm-o-4.5-cpu", "minicpm-o-4.5"},
      {"qwen3-omni-30b-a3b-cpu", "qwen3-omni-30b-a3b"},
  };
  for (const auto& [cpu_name, gpu_name] : pairs) {
    SCOPED_TRACE(cpu_name);
    const SimPreset& cpu = FindPreset(cpu_name);
    const SimPreset& gpu = FindPreset(gpu_name);
    EXPECT_EQ(cpu.period_ms, gpu.period_ms);
    EXPECT_EQ(cpu.tokens_per_frame, gpu.tokens_per_frame);
    EXPECT_EQ(cpu.output_tokens_per_frame, gpu.output_tokens_per_frame);
    EXPECT_EQ(cpu.kv_bytes_per_token, gpu.kv_bytes_per_token);
    EXPECT_EQ(cpu.window_tokens, gpu.window_tokens);
    EXPECT_LT(cpu.pool_bytes, gpu.pool_bytes);
    EXPECT_GT(cpu.cost.c0_s, gpu.cost.c0_s);  // a CPU step is slower than a GPU's
    bool names_command = false;
    for (const std::string& a : cpu.assumed) {
      names_command = names_command || a.find("metronome calibrate --model") != std::string::npos;
    }
    EXPECT_TRUE(names_command);
  }
}

TEST(Presets, UnknownNameListsTheCpuPresets) {
  try {
    (void)FindPreset("no-such-preset");
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3-omni-30b-a3b-cpu"), std::string::npos);
  }
}

}  // namespace
}  // namespace metronome::realtime
