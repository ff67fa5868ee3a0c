// The workload driver on a virtual clock: admission in front of the loop (rejections, retries,
// patience), session lifetimes, the saturation forecast against the observed wall, and the
// observability outputs (summary JSON, Prometheus text, JSON-lines events) of one run.
#include "metronome/realtime/workload_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <sstream>
#include <string>

#include "metronome/base/errors.h"
#include "metronome/realtime/cost_model.h"
#include "support/prometheus_validator.h"

namespace metronome::realtime {
namespace {

WorkloadOptions Options(const kv::KvPolicy& policy, std::int64_t sessions, double duration_s) {
  WorkloadOptions o;
  o.session.period_ms = 80.0;
  o.session.deadline_ms = 80.0;  // resolved: the period
  o.session.input_tokens_per_frame = 3;
  o.session.output_tokens_per_frame = 1;
  o.session.policy = policy;
  o.population.sessions = sessions;
  o.population.duration_s = duration_s;
  o.supervisor.admission = "static:" + std::to_string(sessions);
  o.supervisor.log_to_stderr = false;
  return o;
}

// 10 sessions x 4 tokens / 80 ms into 1000 blocks of 16 tokens: t_sat = 16000 / 500 = 32 s.
TEST(WorkloadRunnerTest, FullKvWallMatchesTheOnlineForecast) {
  CostModelBackend backend({.c0_s = 0.002}, 1000, 16);
  ManualClock clock;
  WorkloadRunner runner(&backend, &clock, Options(kv::KvPolicy::Full(), 10, 60.0));
  const RunSummary s = runner.Run();
  ASSERT_TRUE(std::isfinite(s.first_starved_at_s));
  ASSERT_TRUE(std::isfinite(s.t_sat_predicted_s)) << "full KV grows: the forecast is finite";
  EXPECT_NEAR(s.first_starved_at_s, 32.0, 3.2);
  EXPECT_NEAR(s.t_sat_predicted_s, s.first_starved_at_s, 0.1 * s.first_starved_at_s);
  EXPECT_LT(s.t_sat_forecast_at_s, 10.0 + 1.0) << "made soon after the population was complete";
  EXPECT_EQ(s.mute_alarms, 10);
  EXPECT_GT(s.starved, 0);
  EXPECT_EQ(s.deadline_misses(), 0) << "the failure is silent to a deadline metric";
  EXPECT_DOUBLE_EQ(s.kv_peak_fraction, 1.0);
  EXPECT_EQ(s.admitted, 10);
  EXPECT_EQ(s.rejected, 0);
  // Starved frames are delivered at the deadline: the p99 shows the wall as latency = D.
  EXPECT_NEAR(s.p99_frame_latency_ms, 80.0, 0.5);
  // The samples' interval view: every frame counted once; one output token per frame before the
  // wall, none after it, where the interval p50 sits at the deadline.
  std::int64_t counted = 0;
  for (const RunSample& x : runner.samples()) counted += x.interval_frames;
  EXPECT_EQ(counted, runner.samples().back().frames);  // frames up to the last sample
  const RunSample* before = nullptr;
  const RunSample* after = nullptr;
  for (const RunSample& x : runner.samples()) {
    if (x.t_s > 20.0 && x.t_s < 25.0) before = &x;
    if (x.t_s > 50.0 && x.t_s < 55.0) after = &x;
  }
  ASSERT_NE(before, nullptr);
  ASSERT_NE(after, nullptr);
  EXPECT_DOUBLE_EQ(before->interval_tokens_per_frame, 1.0);
  EXPECT_LT(before->interval_p99_latency_ms, 40.0);
  EXPECT_DOUBLE_EQ(after->interval_tokens_per_frame, 0.0);
  EXPECT_NEAR(after->interval_p50_latency_ms, 80.0, 0.5);
}

TEST(WorkloadRunnerTest, WindowKvSamePopulationNeverStarvesAndForecastIsInfinite) {
  CostModelBackend backend({.c0_s = 0.002}, 1000, 16);
  ManualClock clock;
  WorkloadRunner runner(&backend, &clock, Options(kv::KvPolicy::Window(64, 4), 10, 120.0));
  const RunSummary s = runner.Run();
  EXPECT_EQ(s.starved + s.short_frames + s.late, 0);
  EXPECT_EQ(s.mute_alarms, 0);
  EXPECT_TRUE(std::isnan(s.first_starved_at_s));
  EXPECT_TRUE(std::isnan(s.t_sat_predicted_s)) << "every session sits at its bound";
  EXPECT_EQ(s.ok, s.frames);
  EXPECT_GE(s.frames, 10 * 1499);
  EXPECT_LT(s.kv_peak_fraction, 0.1);
  EXPECT_NEAR(s.active_mean_second_half, 10.0, 1e-9);
  EXPECT_NEAR(s.limit_mean_second_half, 10.0, 1e-9);
}

TEST(WorkloadRunnerTest, RejectedPopulationClientsRetryUntilAdmitted) {
  CostModelBackend backend({.c0_s = 0.002}, 4000, 16);
  ManualClock clock;
  WorkloadOptions o = Options(kv::KvPolicy::Window(64, 4), 8, 40.0);
  o.supervisor.admission = "static:5";
  o.population.session_duration = "fixed:10";
  WorkloadRunner runner(&backend, &clock, o);
  std::int64_t max_active = 0;
  runner.on_sample = [&](const RunSample& s) { max_active = std::max(max_active, s.active); };
  const RunSummary s = runner.Run();
  EXPECT_LE(max_active, 5);
  EXPECT_EQ(s.active_peak, 5);
  EXPECT_GT(s.rejected, 0);
  // 8 clients, 10 s each, 5 at a time: all 8 served in the first ~20 s; nobody gives up.
  EXPECT_EQ(s.admitted, 8);
  EXPECT_EQ(s.abandoned, 0);
  EXPECT_EQ(s.limit_final, 5);
  // Each of the 8 clients is one arrival, however often it was refused.
  EXPECT_EQ(s.arrivals, 8);
  EXPECT_DOUBLE_EQ(s.rejections_per_arrival(), static_cast<double>(s.rejected) / 8.0);
  for (const SessionRecord& r : runner.sessions()) {
    // Sessions end at their duration (at the first loop turn after it: within one 2 ms step).
    EXPECT_GE(r.ended_s, r.scheduled_end_s - 1e-9);
    EXPECT_LE(r.ended_s, r.scheduled_end_s + 0.0021);
    // 10 s at 80 ms: 125 frame arrivals; the last may still be in flight at the end.
    EXPECT_GE(r.frames, 124);
    EXPECT_LE(r.frames, 125);
  }
}

TEST(WorkloadRunnerTest, ArrivingClientsGiveUpAfterTheirPatience) {
  CostModelBackend backend({.c0_s = 0.002}, 4000, 16);
  ManualClock clock;
  WorkloadOptions o = Options(kv::KvPolicy::Window(64, 4), 0, 60.0);
  o.population.arrival = "poisson:2";
  o.supervisor.admission = "static:3";  // sessions never end: after 3, everyone is rejected
  o.population.patience_s = 1.0;
  WorkloadRunner runner(&backend, &clock, o);
  const RunSummary s = runner.Run();
  EXPECT_EQ(s.admitted, 3);
  // ~120 arrivals, each backing off from an 80 ms hint (jittered x [1, 1.5), doubling: asks at
  // about 0, 0.1, 0.3 and 0.7 s) for 1 s: 3 to 5 rejections each, where a fixed 80 ms retry made
  // about 13.
  EXPECT_GT(s.abandoned, 80);
  EXPECT_LT(s.abandoned, 160);
  EXPECT_GE(s.rejected, 3 * s.abandoned);
  EXPECT_LE(s.rejected, 5 * (s.abandoned + 3));
  // Every client that asked is one arrival: admitted, gone, or still retrying when the run ended
  // (those of its last second).
  EXPECT_GE(s.arrivals, s.admitted + s.abandoned);
  EXPECT_LE(s.arrivals, s.admitted + s.abandoned + 10);
  EXPECT_GT(s.rejections_per_arrival(), 2.5);
  EXPECT_LT(s.rejections_per_arrival(), 5.0);
}

TEST(WorkloadRunnerTest, MemoryAdmissionHoldsWindowSessionsToWhatThePoolFits) {
  const std::int64_t bound = kv::KvPolicy::Window(64, 4).MaxResidentBlocks(16, 5);
  CostModelBackend backend({.c0_s = 0.002}, 10 * bound + 3, 16);
  ManualClock clock;
  WorkloadOptions o = Options(kv::KvPolicy::Window(64, 4), 30, 30.0);
  o.supervisor.admission = "memory";
  WorkloadRunner runner(&backend, &clock, o);
  const RunSummary s = runner.Run();
  EXPECT_EQ(s.admitted, 10);
  EXPECT_EQ(s.starved, 0);
  EXPECT_EQ(s.limit_final, admission::kNoLimit);
  EXPECT_EQ(s.ToJson()["limit_final"], nullptr);
}

TEST(WorkloadRunnerTest, SummaryJsonHasEveryDocumentedField) {
  CostModelBackend backend({.c0_s = 0.002}, 1000, 16);
  ManualClock clock;
  WorkloadRunner runner(&backend, &clock, Options(kv::KvPolicy::Full(), 4, 5.0));
  const nlohmann::json j = runner.Run().ToJson();
  for (const char* key :
       {"frames", "ok_frames", "late_frames", "starved_frames", "short_frames", "deadline_misses",
        "mute_alarms", "first_starved_at_s", "t_sat_predicted_s", "kv_peak_fraction", "admitted",
        "rejected", "limit_final", "limit_mean_second_half", "active_mean_second_half",
        "p50_frame_latency_ms", "p99_frame_latency_ms", "deadline_ms"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["first_starved_at_s"], nullptr);
  EXPECT_EQ(j["deadline_ms"], 80.0);
  EXPECT_EQ(j["frames"], j["ok_frames"]);
}

TEST(WorkloadRunnerTest, MetricsAreValidPrometheusTextAndEventsAreJsonLines) {
  CostModelBackend backend({.c0_s = 0.002}, 300, 16);
  ManualClock clock;
  telemetry::MetricsRegistry registry;
  std::ostringstream lines;
  telemetry::EventLog events(lines);
  WorkloadOptions o =
      Options(kv::KvPolicy::Full(), 6, 40.0);  // 4 x 50 tokens/s fill 300 x 16 at 24 s
  o.supervisor.admission = "static:4";
  WorkloadRunner runner(&backend, &clock, o, &registry, &events);
  const RunSummary s = runner.Run();
  ASSERT_GT(s.starved, 0) << "the run must reach the wall to exercise alarms";

  test_support::Exposition e;
  const std::string text = registry.ExpositionText();
  ASSERT_EQ(test_support::ValidateExposition(text, &e), "") << text;
  EXPECT_EQ(e.Value("metronome_frames_total", {{"outcome", "starved"}}),
            static_cast<double>(s.starved));
  EXPECT_EQ(e.Value("metronome_frames_total", {{"outcome", "ok"}}), static_cast<double>(s.ok));
  EXPECT_EQ(e.Value("metronome_mute_alarms_total"), static_cast<double>(s.mute_alarms));
  EXPECT_EQ(e.Value("metronome_sessions_admitted_total"), 4.0);
  EXPECT_EQ(e.Value("metronome_sessions_rejected_total", {{"reason", "limit"}}),
            static_cast<double>(s.rejected));
  EXPECT_EQ(e.Value("metronome_admission_limit"), 4.0);
  EXPECT_EQ(e.Value("metronome_frame_latency_ms_count"), static_cast<double>(s.frames));
  EXPECT_EQ(e.Value("metronome_kv_blocks_used") + e.Value("metronome_kv_blocks_free"), 300.0);

  std::set<std::string> types;
  std::istringstream in(lines.str());
  std::string line;
  std::int64_t frames = 0;
  std::int64_t alarms = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);  // throws on an invalid line
    ASSERT_TRUE(j.contains("t_ms") && j.contains("type")) << line;
    types.insert(j["type"].get<std::string>());
    if (j["type"] == "frame") ++frames;
    if (j["type"] == "alarm" && j["kind"] == "mute") ++alarms;
  }
  EXPECT_EQ(frames, s.frames);
  EXPECT_EQ(alarms, s.mute_alarms);
  EXPECT_TRUE(types.contains("admission"));
}

TEST(WorkloadRunnerTest, RejectsBadOptionsWithTheFlagName) {
  CostModelBackend backend({.c0_s = 0.002}, 100, 16);
  ManualClock clock;
  WorkloadOptions o = Options(kv::KvPolicy::Full(), 0, 10.0);
  EXPECT_THROW(WorkloadRunner(&backend, &clock, o), ConfigError);  // no population, no arrivals
  o.population.sessions = 2;
  o.population.duration_s = -1.0;
  try {
    WorkloadRunner runner(&backend, &clock, o);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("duration_s = -1"), std::string::npos) << e.what();
  }
  o.population.duration_s = 10.0;
  o.population.arrival = "poisson:-1";
  EXPECT_THROW(WorkloadRunner(&backend, &clock, o), ConfigError);
  o.population.arrival.clear();
  o.supervisor.admission = "static:x";
  EXPECT_THROW(WorkloadRunner(&backend, &clock, o), ConfigError);
}

// A mix: each client draws its class by share; every arrival, admission, rejection and frame is
// counted in exactly one class, and a priced class's work is its price.
TEST(WorkloadRunnerTest, AMixIsReportedPerClassAndTheClassesAddUp) {
  const CostModel cost{.c0_s = 0.002, .c1_s_per_token = 1e-4};
  CostModelBackend backend(cost, 100000, 16);
  ManualClock clock;
  WorkloadOptions o = Options(kv::KvPolicy::Window(64, 4), 0, 60.0);
  o.population.arrival = "poisson:20";
  o.population.session_duration = "fixed:5";
  o.supervisor.admission = "static:30";
  o.supervisor.cost_model = cost;
  o.supervisor.reference_session = o.session;
  WorkloadClass light{.name = "light", .session = o.session, .share = 3.0};
  WorkloadClass heavy{.name = "heavy", .session = o.session, .share = 1.0};
  heavy.session.period_ms = 400.0;
  heavy.session.deadline_ms = 400.0;
  heavy.session.input_tokens_per_frame = 30;
  o.classes = {light, heavy};
  WorkloadRunner runner(&backend, &clock, o);
  const RunSummary s = runner.Run();
  ASSERT_EQ(s.classes.size(), 2U);
  EXPECT_EQ(s.classes[0].name, "light");
  EXPECT_EQ(s.classes[1].name, "heavy");
  EXPECT_EQ(s.classes[0].arrivals + s.classes[1].arrivals, s.arrivals);
  EXPECT_EQ(s.classes[0].admitted + s.classes[1].admitted, s.admitted);
  EXPECT_EQ(s.classes[0].rejected + s.classes[1].rejected, s.rejected);
  EXPECT_EQ(s.classes[0].frames + s.classes[1].frames, s.frames);
  // Shares 3:1 of 1200 expected arrivals.
  EXPECT_NEAR(static_cast<double>(s.classes[0].arrivals) / static_cast<double>(s.arrivals), 0.75,
              0.05);
  EXPECT_DOUBLE_EQ(s.classes[0].admitted_work, static_cast<double>(s.classes[0].admitted));
  // Per second: light 3 + 1 tokens every 80 ms (50), heavy 30 + 1 every 400 ms (77.5): 1.55 units.
  EXPECT_NEAR(s.classes[1].admitted_work / static_cast<double>(s.classes[1].admitted), 1.55, 0.05);
  EXPECT_DOUBLE_EQ(s.classes[1].deadline_ms, 400.0);
  EXPECT_GT(s.classes[1].active_work_mean_second_half, 0.0);
  const nlohmann::json j = s.ToJson();
  ASSERT_EQ(j["classes"].size(), 2U);
  EXPECT_EQ(j["classes"][1]["name"], "heavy");
  EXPECT_EQ(j["classes"][1]["frames"], s.classes[1].frames);
  // Without a mix there is no "classes" key.
  WorkloadRunner plain(&backend, &clock, Options(kv::KvPolicy::Window(64, 4), 4, 5.0));
  EXPECT_FALSE(plain.Run().ToJson().contains("classes"));
}

// A class with a prompt: its prefill is charged as work (PriceSession's prompt_work_s of each
// session admitted in the second half, in unit-seconds over the half), and the frames that waited
// for their session's own prompt are counted apart; a class without one has neither.
TEST(WorkloadRunnerTest, AMixChargesPromptsAndCountsTheFramesBehindThemApart) {
  const CostModel cost{.c0_s = 0.002, .c1_s_per_token = 1e-4, .c2_s_per_kv_token = 1e-7};
  CostModelBackend backend(cost, 100000, 16);
  ManualClock clock;
  WorkloadOptions o = Options(kv::KvPolicy::Window(64, 4), 0, 60.0);
  o.population.arrival = "poisson:4";
  o.population.session_duration = "fixed:5";
  o.supervisor.admission = "static:40";
  o.supervisor.cost_model = cost;
  o.supervisor.loop.max_step_tokens = 64;
  o.supervisor.reference_session = o.session;
  WorkloadClass plain{.name = "plain", .session = o.session, .share = 1.0};
  WorkloadClass prompted{.name = "prompted", .session = o.session, .share = 1.0};
  prompted.session.prompt.assign(1000, 7);
  o.classes = {plain, prompted};
  WorkloadRunner runner(&backend, &clock, o);
  const RunSummary s = runner.Run();
  ASSERT_EQ(s.classes.size(), 2U);
  const ClassSummary& without = s.classes[0];
  const ClassSummary& with = s.classes[1];
  EXPECT_EQ(without.own_prompt_frames, 0);
  EXPECT_EQ(without.prompt_work_mean_second_half, 0.0);
  ASSERT_GT(with.admitted, 10);
  // Every session's prompt frame, and the frames that arrived during its prefill.
  EXPECT_GE(with.own_prompt_frames, with.admitted - 1);
  EXPECT_LT(with.own_prompt_frames, with.frames);
  EXPECT_LE(with.own_prompt_late_frames, with.own_prompt_frames);
  EXPECT_LE(with.p99_after_own_prompt_ms, with.p99_frame_latency_ms);
  // The charge is a whole number of sessions' prompts over the 30 s half.
  const double units_per_prompt =
      PriceSession(cost, prompted.session).prompt_work_s / PriceSession(cost, o.session).work_share;
  const double sessions = with.prompt_work_mean_second_half * 30.0 / units_per_prompt;
  EXPECT_GT(sessions, 10.0);
  EXPECT_LE(sessions, static_cast<double>(with.admitted) + 1e-6);
  EXPECT_NEAR(sessions, std::round(sessions), 1e-6);
  const nlohmann::json j = s.ToJson()["classes"][1];
  for (const char* key : {"prompt_work_mean_second_half", "own_prompt_frames",
                          "own_prompt_late_frames", "p99_after_own_prompt_ms"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
}

// Twenty sessions start together, each with a prompt that takes several of its periods: every
// one's first frames are late, by its own declaration. AIMD's signal leaves them out, so the
// budget is not cut for the load the prompts' owners chose (without the rule it is: their late
// frames are far more than one session's share).
TEST(WorkloadRunnerTest, FramesBehindTheirOwnPromptDoNotCutTheBudget) {
  const CostModel cost{.c0_s = 0.002, .c1_s_per_token = 2e-5, .c2_s_per_kv_token = 1e-8};
  CostModelBackend backend(cost, 100000, 16);
  ManualClock clock;
  WorkloadOptions o = Options(kv::KvPolicy::Window(64, 4), 20, 20.0);
  o.session.prompt.assign(3000, 7);
  o.supervisor.admission = "aimd";
  o.supervisor.aimd.initial_limit = 20;
  o.supervisor.cost_model = cost;
  o.supervisor.loop.max_step_tokens = 256;
  o.supervisor.reference_session = o.session;
  o.supervisor.reference_session.prompt.clear();
  WorkloadRunner runner(&backend, &clock, o);
  const RunSummary s = runner.Run();
  EXPECT_EQ(s.admitted, 20);
  EXPECT_GT(s.late, 20) << "the prompts' frames are late: the case this test is about";
  for (const admission::LimitChange& c : runner.limit_changes()) {
    EXPECT_GE(c.to, c.from) << "at " << c.t_s << " s: " << c.reason;
  }
}

}  // namespace
}  // namespace metronome::realtime
