// Static and memory controllers (exact decisions), the shared helpers, and the factory's parsing
// and validation errors.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "metronome/admission/admission.h"
#include "metronome/admission/memory_controller.h"
#include "metronome/admission/static_controller.h"
#include "metronome/base/errors.h"

namespace metronome::admission {
namespace {

SessionRequest Request(std::int64_t blocks) {
  return {.period_ms = 80.0, .deadline_ms = 80.0, .projected_blocks = blocks};
}

SystemState State(std::int64_t active, std::int64_t free_blocks, std::int64_t total,
                  std::int64_t reserved) {
  return {.active_sessions = active,
          .free_blocks = free_blocks,
          .total_blocks = total,
          .reserved_blocks = reserved};
}

TEST(StaticControllerTest, AdmitsBelowLimitAndRejectsAtIt) {
  StaticController c(2);
  EXPECT_TRUE(c.Decide(Request(0), State(0, 0, 0, 0), 0.0).admit);
  EXPECT_TRUE(c.Decide(Request(0), State(1, 0, 0, 0), 0.0).admit);
  const Decision d = c.Decide(Request(0), State(2, 0, 0, 0), 0.0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, "limit");
  EXPECT_EQ(d.detail, "active 2 >= static limit 2");
  EXPECT_GE(d.retry_after_ms, 80.0);  // one period (no session has ended yet), jittered
  EXPECT_LT(d.retry_after_ms, 80.0 * (1.0 + RetryHint::kJitterFraction));
  EXPECT_EQ(c.limit(), 2);
  EXPECT_TRUE(c.TakeLimitChanges().empty());
  EXPECT_EQ(c.Describe(), "static(limit=2)");
}

TEST(StaticControllerTest, ZeroAdmitsNobody) {
  StaticController c(0);
  EXPECT_FALSE(c.Decide(Request(0), State(0, 0, 0, 0), 0.0).admit);
}

TEST(MemoryControllerTest, AdmitsExactlyWhileUnpromisedBlocksCoverProjection) {
  MemoryController c(MemoryOptions{});
  // free 100, promised 30: 70 blocks can still be promised.
  EXPECT_TRUE(c.Decide(Request(70), State(5, 100, 200, 30), 0.0).admit);
  const Decision d = c.Decide(Request(71), State(5, 100, 200, 30), 0.0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, "pool");
  EXPECT_EQ(d.detail, "needs 71 blocks; free 100, promised 30 of 200");
  EXPECT_GE(d.retry_after_ms, 80.0);  // one period (no session has ended yet), jittered
  EXPECT_LT(d.retry_after_ms, 80.0 * (1.0 + RetryHint::kJitterFraction));
  EXPECT_EQ(c.limit(), kNoLimit);
}

TEST(MemoryControllerTest, OverPromisedPoolRejectsEvenTinySessions) {
  MemoryController c(MemoryOptions{});
  EXPECT_FALSE(c.Decide(Request(1), State(5, 10, 200, 40), 0.0).admit);
}

TEST(MemoryControllerTest, HeadroomIsNeverPromised) {
  MemoryController c(MemoryOptions{.full_mode_session_s = 300.0, .headroom_fraction = 0.1});
  // ceil(0.1 * 100) = 10 blocks kept back of 70 free.
  EXPECT_TRUE(c.Decide(Request(60), State(0, 70, 100, 0), 0.0).admit);
  EXPECT_FALSE(c.Decide(Request(61), State(0, 70, 100, 0), 0.0).admit);
  EXPECT_EQ(c.Describe(), "memory(full_mode_session_s=300, headroom_fraction=0.1)");
}

TEST(MemoryControllerTest, SessionWithoutBlocksAlwaysFits) {
  MemoryController c(MemoryOptions{});
  EXPECT_TRUE(c.Decide(Request(0), State(9, 0, 100, 50), 0.0).admit);
}

TEST(SessionsThatFitTest, CountsWholeSessionsOnTopOfActive) {
  const MemoryOptions m;
  EXPECT_EQ(SessionsThatFit(Request(10), State(3, 100, 200, 45), m), 3 + 5);
  EXPECT_EQ(SessionsThatFit(Request(10), State(3, 10, 200, 45), m), 3);
  EXPECT_EQ(SessionsThatFit(Request(0), State(3, 0, 0, 0), m),
            std::numeric_limits<std::int64_t>::max());
}

TEST(ProjectFullModeBlocksTest, ProjectsPromptPlusFramesAtSessionLength) {
  // 300 s at 80 ms = 3750 frames of 1 token, + 100 prompt tokens = 3850 tokens = 240.6 blocks.
  EXPECT_EQ(ProjectFullModeBlocks(MemoryOptions{}, 80.0, 1, 100, 16), 241);
  EXPECT_EQ(ProjectFullModeBlocks(MemoryOptions{.full_mode_session_s = 60.0}, 80.0, 2, 0, 16),
            94);  // 750 frames * 2 = 1500 tokens
}

std::string FactoryError(const std::string& spec, const AimdOptions& aimd = {},
                         const MemoryOptions& memory = {}, const Gradient2Options& gradient2 = {}) {
  try {
    (void)MakeController(spec, aimd, memory, gradient2);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(MakeControllerTest, BuildsEachController) {
  const auto s = MakeController("static:8", {}, {});
  EXPECT_EQ(s->limit(), 8);
  EXPECT_EQ(s->Describe(), "static(limit=8)");
  EXPECT_EQ(MakeController("memory", {}, {})->limit(), kNoLimit);
  const auto a = MakeController("aimd", AimdOptions{.initial_limit = 12}, {});
  EXPECT_EQ(a->limit(), 12);
  EXPECT_EQ(a->Describe().rfind("aimd(", 0), 0u);
  const auto g = MakeController("gradient2", {}, {}, Gradient2Options{.initial_limit = 9});
  EXPECT_EQ(g->limit(), 9);
  EXPECT_EQ(g->Describe().rfind("gradient2(", 0), 0u);
}

TEST(MakeControllerTest, NamesTheBadSpec) {
  EXPECT_EQ(
      FactoryError("dynamic"),
      "admission: unknown controller 'dynamic' (expected static:N, memory, aimd or gradient2)");
  EXPECT_EQ(FactoryError(""),
            "admission: unknown controller '' (expected static:N, memory, aimd or gradient2)");
  EXPECT_EQ(FactoryError("static:"),
            "admission: 'static:': static:N needs an integer N >= 0, got ''");
  EXPECT_EQ(FactoryError("static:-1"),
            "admission: 'static:-1': static:N needs an integer N >= 0, got '-1'");
  EXPECT_EQ(FactoryError("static:3x"),
            "admission: 'static:3x': static:N needs an integer N >= 0, got '3x'");
  EXPECT_EQ(FactoryError("static:99999999999999999999"),
            "admission: 'static:99999999999999999999': static:N needs an integer N >= 0, got "
            "'99999999999999999999'");
  EXPECT_EQ(FactoryError("AIMD"),
            "admission: unknown controller 'AIMD' (expected static:N, memory, aimd or gradient2)");
}

TEST(MakeControllerTest, NamesTheBadOption) {
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.beta = 1.5}),
            "admission: aimd.beta must be in (0, 1), got 1.5");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.low_target = 0.9, .high_target = 0.85}),
            "admission: aimd.high_target must be > aimd.low_target (0.9), got 0.85");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.percentile = 0.0}),
            "admission: aimd.percentile must be in (0, 100], got 0");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.window = {.window_s = -2.0}}),
            "admission: aimd.window_s must be > 0, got -2");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.initial_limit = 0}),
            "admission: aimd.initial_limit must be in [1, 1024], got 0");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.window = {.min_limit = 5, .max_limit = 4}}),
            "admission: aimd.max_limit must be >= aimd.min_limit (5), got 4");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.increase_step = 0}),
            "admission: aimd.increase_step must be >= 1, got 0");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.miss_ratio_threshold = 1.0}),
            "admission: aimd.miss_ratio_threshold must be in [0, 1), got 1");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.window = {.min_samples = 0}}),
            "admission: aimd.min_samples must be >= 1, got 0");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.max_samples = 0}),
            "admission: aimd.max_samples must be in [1, 16777216], got 0");
  EXPECT_EQ(FactoryError("memory", {}, MemoryOptions{.headroom_fraction = 1.0}),
            "admission: memory.headroom_fraction must be in [0, 1), got 1");
  EXPECT_EQ(FactoryError("aimd", {}, MemoryOptions{.full_mode_session_s = 0.0}),
            "admission: memory.full_mode_session_s must be > 0, got 0");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.slow_start_factor = 0.5}),
            "admission: aimd.slow_start_factor must be in [1, 16], got 0.5");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.headroom_gain = 2.0}),
            "admission: aimd.headroom_gain must be in [0, 1], got 2");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.window = {.window_frames = -1}}),
            "admission: aimd.window_frames must be >= 0, got -1");
  EXPECT_EQ(FactoryError("aimd", AimdOptions{.predicted_limit = -3}),
            "admission: aimd.predicted_limit must be >= 0, got -3");
  EXPECT_EQ(FactoryError("gradient2", {}, {}, Gradient2Options{.smoothing = 0.0}),
            "admission: gradient2.smoothing must be in (0, 1], got 0");
  EXPECT_EQ(FactoryError("gradient2", {}, {}, Gradient2Options{.tolerance = 0.9}),
            "admission: gradient2.tolerance must be >= 1, got 0.9");
  // The window's fields are checked once (Validate(WindowOptions)) and named under each prefix.
  EXPECT_EQ(FactoryError("gradient2", {}, {}, Gradient2Options{.window = {.min_samples = 0}}),
            "admission: gradient2.min_samples must be >= 1, got 0");
  EXPECT_EQ(FactoryError("gradient2", {}, {}, Gradient2Options{.window = {.window_s = 0.0}}),
            "admission: gradient2.window_s must be > 0, got 0");
  EXPECT_EQ(FactoryError("gradient2", {}, {}, Gradient2Options{.initial_limit = 2000}),
            "admission: gradient2.initial_limit must be in [1, 1024], got 2000");
  // static ignores the other controllers' options.
  EXPECT_EQ(FactoryError("static:1", AimdOptions{.beta = 2.0}), "(no error)");
}

}  // namespace
}  // namespace metronome::admission
