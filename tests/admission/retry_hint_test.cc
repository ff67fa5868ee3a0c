// RetryHint's crowd rule: refusals that wait for a session end are spread over the ends to come
// (a virtual queue), so a crowd of k waiting clients retries about once per end, not k times.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <queue>
#include <vector>

#include "metronome/admission/admission.h"

namespace metronome::admission {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A hint that has seen `ends` sessions end, one every gap_s, from `sessions` active at t = 0.
RetryHint HintAfterEnds(int sessions, int ends, double gap_s) {
  RetryHint h;
  h.Observe(0.0, sessions);
  for (int i = 1; i <= ends; ++i) h.Observe(gap_s * i, sessions - i);
  return h;
}

TEST(RetryHintCrowdTest, WithNoCrowdTheHintIsAboutOneEndGap) {
  RetryHint h = HintAfterEnds(40, 10, 2.0);
  // Sessions keep ending every 2 s; refusals far apart (each one's turn has passed before the
  // next): one gap each, jittered.
  for (int i = 0; i < 5; ++i) {
    for (int e = 1; e <= 5; ++e) h.Observe(20.0 + 10.0 * i + 2.0 * e, 40 - 10 - 5 * i - e);
    const double now_s = 30.0 + 10.0 * i;
    const double ms = h.Ms(now_s, 80.0, kInf);
    EXPECT_GE(ms, 2000.0 * 0.95) << i;
    EXPECT_LT(ms, 2000.0 * 1.05 * (1.0 + RetryHint::kJitterFraction)) << i;
    EXPECT_DOUBLE_EQ(h.QueuedS(now_s + ms / 1000.0), 0.0) << i;
  }
}

TEST(RetryHintCrowdTest, ACrowdRefusedTogetherIsSpreadOverTheEndsToCome) {
  RetryHint h = HintAfterEnds(20, 10, 2.0);
  const double gap_s = h.ExpectedEndGapS(20.0);
  ASSERT_NEAR(gap_s, 2.0, 0.1);
  double previous_ms = 0.0;
  for (int k = 1; k <= 8; ++k) {
    const double ms = h.Ms(20.0, 80.0, kInf);
    // The k-th client waits for the k-th end: k gaps, plus at most half a gap of jitter.
    EXPECT_GE(ms, 1000.0 * k * gap_s - 1e-6) << k;
    EXPECT_LT(ms, 1000.0 * (k + RetryHint::kJitterFraction) * gap_s) << k;
    EXPECT_GT(ms, previous_ms) << k;  // first refused, first back
    previous_ms = ms;
  }
  EXPECT_NEAR(h.QueuedS(20.0), 8 * gap_s, 1e-9);
  // Time drains the queue: once every promised end has passed, the next refusal waits one gap.
  const double later_s = 20.0 + 8 * gap_s + 0.1;
  EXPECT_DOUBLE_EQ(h.QueuedS(later_s), 0.0);
  EXPECT_LT(h.Ms(later_s, 80.0, kInf),
            1000.0 * (1.0 + RetryHint::kJitterFraction) * h.ExpectedEndGapS(later_s));
}

TEST(RetryHintCrowdTest, ASoonerDecisionComesFirstAndTakesNoEnd) {
  RetryHint h = HintAfterEnds(20, 10, 2.0);
  EXPECT_LT(h.Ms(20.0, 80.0, 0.5), 500.0 * (1.0 + RetryHint::kJitterFraction));
  EXPECT_DOUBLE_EQ(h.QueuedS(20.0), 0.0);
  // Before any end only a decision or the period can be offered, and nothing is queued.
  RetryHint fresh;
  fresh.Observe(0.0, 4);
  EXPECT_LT(fresh.Ms(1.0, 80.0, kInf), 80.0 * (1.0 + RetryHint::kJitterFraction));
  EXPECT_DOUBLE_EQ(fresh.QueuedS(1.0), 0.0);
}

TEST(RetryHintCrowdTest, TheQueueNeverReachesPastTheLongestHint) {
  RetryHint h = HintAfterEnds(20, 10, 2.0);
  double ms = 0.0;
  for (int k = 0; k < 100; ++k) ms = h.Ms(20.0, 80.0, kInf);
  EXPECT_LE(ms, RetryHint::kMaxHintMs);
  EXPECT_LE(h.QueuedS(20.0), RetryHint::kMaxHintMs / 1000.0 + 1e-9);
}

// The property: a server full at `capacity` sessions, one ending every gap_s; a steady crowd of
// `crowd` clients (each admitted one is replaced by a new arrival) that obey every hint exactly.
// Returns the refusals per admission over `admissions` admissions. `crowd_rule` false: the hint
// without the queue (one end gap, jittered), what every client was told before.
double RefusalsPerAdmission(int crowd, double gap_s, int admissions, bool crowd_rule) {
  constexpr int kCapacity = 8;
  RetryHint h;
  std::uint64_t rng = 7;
  std::priority_queue<double, std::vector<double>, std::greater<>> asks;  // clients' next asks
  for (int i = 0; i < crowd; ++i) asks.push(0.0);
  int free_slots = 0;
  double next_end_s = gap_s;
  h.Observe(0.0, kCapacity);
  std::int64_t refusals = 0;
  std::int64_t admitted = 0;
  while (admitted < admissions) {
    if (next_end_s <= asks.top()) {
      ++free_slots;
      h.Observe(next_end_s, kCapacity - free_slots);
      next_end_s += gap_s;
      continue;
    }
    const double now_s = asks.top();
    asks.pop();
    h.Observe(now_s, kCapacity - free_slots);
    if (free_slots > 0) {
      --free_slots;
      h.OnAdmit();
      ++admitted;
      asks.push(now_s);  // a new client takes its place in the crowd
      continue;
    }
    ++refusals;
    double hint_ms = h.Ms(now_s, 80.0, kInf);
    if (!crowd_rule) {
      const double u = static_cast<double>(NextRandom(rng) >> 11) * 0x1.0p-53;
      const double end_gap_s = h.ExpectedEndGapS(now_s);
      hint_ms = (std::isfinite(end_gap_s) ? std::max(80.0, 1000.0 * end_gap_s) : 80.0) *
                (1.0 + RetryHint::kJitterFraction * u);
    }
    asks.push(now_s + hint_ms / 1000.0);
  }
  return static_cast<double>(refusals) / static_cast<double>(admitted);
}

TEST(RetryHintCrowdTest, ASteadyCrowdRetriesABoundedNumberOfTimesPerAdmission) {
  for (const int crowd : {1, 4, 16, 64}) {
    const double with_rule = RefusalsPerAdmission(crowd, 0.25, 2000, /*crowd_rule=*/true);
    const double without = RefusalsPerAdmission(crowd, 0.25, 2000, /*crowd_rule=*/false);
    std::printf(
        "[retry] crowd %d, an end every 250 ms: %.2f refusals per admission (one-gap "
        "hint: %.2f)\n",
        crowd, with_rule, without);
    EXPECT_LE(with_rule, 2.0) << crowd;
    if (crowd >= 16) {
      EXPECT_GT(without, 0.5 * crowd) << crowd;  // the storm the rule prevents
    }
  }
}

}  // namespace
}  // namespace metronome::admission
