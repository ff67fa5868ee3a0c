// The supervisor's admission bookkeeping: what a session is projected to hold, and how memory
// admission uses it.
#include "metronome/realtime/supervisor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/realtime/cost_model.h"

namespace metronome::realtime {
namespace {

SessionSpec Spec(const kv::KvPolicy& policy) {
  SessionSpec s;
  s.period_ms = 100.0;
  s.deadline_ms = 100.0;  // resolved: the period
  s.input_tokens_per_frame = 6;
  s.output_tokens_per_frame = 2;
  s.policy = policy;
  return s;
}

TEST(ProjectedBlocksTest, WindowBoundFullProjectionAndContextCap) {
  const admission::MemoryOptions memory{.full_mode_session_s = 60.0};
  const SessionSpec window = Spec(kv::KvPolicy::Window(64, 4));
  EXPECT_EQ(ProjectedBlocks(window, 16, memory), window.policy.MaxResidentBlocks(16, 7));
  // 60 s at 10 frames/s x 8 tokens = 4800 tokens = 300 blocks of 16.
  const SessionSpec full = Spec(kv::KvPolicy::Full());
  EXPECT_EQ(ProjectedBlocks(full, 16, memory), 300);
  // A 1000-token context ends the session at 63 blocks, whatever the assumed duration.
  EXPECT_EQ(ProjectedBlocks(full, 16, memory, 1000), 63);
  EXPECT_EQ(ProjectedBlocks(full, 16, memory, 1'000'000), 300);
  EXPECT_EQ(ProjectedBlocks(window, 16, memory, 1000), window.policy.MaxResidentBlocks(16, 7));
}

// Memory admission reserves each admitted session's projection, so a burst of requests in one turn
// cannot overcommit the pool even though none of them holds a block yet.
TEST(SupervisorTest, MemoryAdmissionReservesProjectionsWithinATurn) {
  CostModelBackend backend({.c0_s = 0.001}, 1000, 16);
  ManualClock clock;
  SupervisorOptions o;
  o.admission = "memory";
  o.memory.full_mode_session_s = 60.0;  // 300 blocks per full-KV session
  o.log_to_stderr = false;
  Supervisor sup(&backend, &clock, o);
  sup.Start();
  int admitted = 0;
  for (int i = 0; i < 5; ++i) admitted += sup.Admit(Spec(kv::KvPolicy::Full()), 0.0).decision.admit;
  EXPECT_EQ(admitted, 3);
  EXPECT_EQ(sup.rejected(), 2);
  const Supervisor::AdmitResult r = sup.Admit(Spec(kv::KvPolicy::Full()), 0.0);
  EXPECT_FALSE(r.decision.admit);
  EXPECT_FALSE(r.decision.reason.empty());
  EXPECT_GT(r.decision.retry_after_ms, 0.0);
  // Ending one frees its reservation.
  sup.End(1, 0.0, EndReason::kClient);
  EXPECT_TRUE(sup.Admit(Spec(kv::KvPolicy::Full()), 0.0).decision.admit);
  SessionSpec bad = Spec(kv::KvPolicy::Full());
  bad.period_ms = 0.0;
  EXPECT_THROW((void)sup.Admit(bad, 0.0), ConfigError);
}

// --max-sessions caps concurrency whatever the controller would allow; ending one frees a slot.
TEST(SupervisorTest, MaxSessionsIsAHardCapOverTheController) {
  CostModelBackend backend({.c0_s = 0.001}, 1000, 16);
  ManualClock clock;
  SupervisorOptions o;
  o.admission = "static:100";
  o.max_sessions = 2;
  o.log_to_stderr = false;
  Supervisor sup(&backend, &clock, o);
  sup.Start();
  EXPECT_TRUE(sup.Admit(Spec(kv::KvPolicy::Window(64, 4)), 0.0).decision.admit);
  EXPECT_TRUE(sup.Admit(Spec(kv::KvPolicy::Window(64, 4)), 0.0).decision.admit);
  const Supervisor::AdmitResult r = sup.Admit(Spec(kv::KvPolicy::Window(64, 4)), 0.0);
  EXPECT_FALSE(r.decision.admit);
  EXPECT_EQ(r.decision.reason, "max_sessions");
  EXPECT_NE(r.decision.detail.find("2 sessions are active"), std::string::npos)
      << r.decision.detail;
  EXPECT_GT(r.decision.retry_after_ms, 0.0);
  sup.End(1, 0.0, EndReason::kClient);
  EXPECT_TRUE(sup.Admit(Spec(kv::KvPolicy::Window(64, 4)), 0.0).decision.admit);
  SupervisorOptions bad = o;
  bad.max_sessions = -1;
  EXPECT_THROW(bad.Validate(), ConfigError);
}

// The limit admission reports (gauge, HAProxy agent): a count controller's limit under
// max_sessions; for memory admission, the sessions of the reference size the pool still holds on
// top of the active ones; kNoLimit when nothing bounds the count.
TEST(SupervisorTest, AdmissionLimitIsTheControllerUnderTheCapsAndThePool) {
  const kv::KvPolicy window = kv::KvPolicy::Window(64, 4);
  const std::int64_t one = ProjectedBlocks(Spec(window), 16, {});
  const auto limit_after = [&](SupervisorOptions o, int sessions) {
    CostModelBackend backend({.c0_s = 0.001}, 1000, 16);
    ManualClock clock;
    o.log_to_stderr = false;
    Supervisor sup(&backend, &clock, o);
    sup.Start();
    for (int i = 0; i < sessions; ++i) EXPECT_TRUE(sup.Admit(Spec(window), 0.0).decision.admit);
    sup.Tick(0.0);
    return sup.admission_limit();
  };
  SupervisorOptions o;
  o.admission = "static:5";
  EXPECT_EQ(limit_after(o, 2), 5);
  o.max_sessions = 3;
  EXPECT_EQ(limit_after(o, 2), 3);
  o.admission = "memory";
  o.max_sessions = 0;
  EXPECT_EQ(limit_after(o, 0), admission::kNoLimit);  // no reference size: no count
  o.reference_session_blocks = one;
  // 1000 blocks: each admitted session holds or was promised `one`; the rest hold whole sessions.
  EXPECT_EQ(limit_after(o, 0), 1000 / one);
  EXPECT_EQ(limit_after(o, 3), 3 + (1000 - 3 * one) / one);
  o.max_sessions = 4;
  EXPECT_EQ(limit_after(o, 3), 4);
}

// The attack of issue 11 (item 2) on the serving core, with the server's settings: a window
// session admitted first, then as many full-KV hogs as memory admission lets in, each declaring a
// 10 s period and 1 token per frame and submitting a frame every millisecond. What it shows:
//   - with enforce_kv_budget and FramePacing (the server), no frame of anyone is ever starved or
//     short (the pool never runs out: every session stays within what admission reserved), the
//     victim is answered every frame, and hogs that reach their budget end with kContextFull;
//   - with neither (burst allowance unbounded, no budget), the same hogs starve the victim: the
//     scenario is one that can fail.
struct HogRun {
  std::int64_t victim_frames = 0;
  std::int64_t victim_submitted = 0;
  std::int64_t starved_or_short = 0;
  std::int64_t hogs_admitted = 0;
  std::int64_t hogs_ended_at_budget = 0;
  std::int64_t peak_used_blocks = 0;
};

HogRun RunHogAttack(bool server_rules) {
  CostModelBackend backend({.c0_s = 0.0002}, 64, 16);
  ManualClock clock;
  SupervisorOptions o;
  o.admission = "memory";
  // 30 s / 10 s = 3 frames of 1 + 1 tokens: a 1-block (16-token) budget per hog.
  o.memory.full_mode_session_s = 30.0;
  o.enforce_kv_budget = server_rules;
  if (!server_rules) o.loop.pacing = {.burst_frames = 1024, .jitter_ms = 3.6e6};
  o.log_to_stderr = false;
  Supervisor sup(&backend, &clock, o);
  sup.Start();
  HogRun run;
  SessionSpec victim_spec;
  victim_spec.period_ms = 40.0;
  victim_spec.deadline_ms = 40.0;  // resolved: the period
  victim_spec.input_tokens_per_frame = 2;
  victim_spec.output_tokens_per_frame = 1;
  victim_spec.policy = kv::KvPolicy::Window(64, 4);
  victim_spec.external_frames = true;
  const Supervisor::AdmitResult victim = sup.Admit(victim_spec, 0.0);
  EXPECT_TRUE(victim.decision.admit);
  SessionSpec hog_spec;
  hog_spec.period_ms = 10000.0;
  hog_spec.deadline_ms = 10000.0;  // resolved: the period
  hog_spec.input_tokens_per_frame = 1;
  hog_spec.output_tokens_per_frame = 1;
  hog_spec.policy = kv::KvPolicy::Full();
  hog_spec.external_frames = true;
  std::set<RealtimeSessionId> hogs;
  struct Observer final : SessionObserver {
    HogRun* run = nullptr;
    RealtimeSessionId victim = 0;
    std::set<RealtimeSessionId>* hogs = nullptr;
    void OnFrame(const FrameRecord& r) override {
      if (r.session == victim) ++run->victim_frames;
      if (r.outcome == FrameOutcome::kStarved || r.outcome == FrameOutcome::kShort) {
        ++run->starved_or_short;
      }
    }
    void OnMuteAlarm(const MuteAlarm& /*alarm*/) override {}
    void OnSessionEnded(const SessionEnded& e) override {
      EXPECT_TRUE(hogs->contains(e.session)) << "only hogs reach a limit";
      if (e.reason == EndReason::kContextFull) ++run->hogs_ended_at_budget;
      hogs->erase(e.session);
    }
  } observer;
  observer.run = &run;
  observer.victim = victim.id;
  observer.hogs = &hogs;
  sup.set_observer(&observer);
  constexpr int kMs = 60000;  // a minute of virtual time, one turn per millisecond
  for (int ms = 0; ms < kMs; ++ms) {
    const double now = sup.Now();
    sup.Tick(now);
    if (ms % 50 == 0) {  // a new hog asks every 50 ms; memory admission says when it fits
      const Supervisor::AdmitResult h = sup.Admit(hog_spec, now);
      if (h.decision.admit) {
        hogs.insert(h.id);
        ++run.hogs_admitted;
      }
    }
    if (ms % 40 == 0) {
      run.victim_submitted += sup.Submit(victim.id, {1, 2}) == RealtimeLoop::SubmitResult::kOk;
    }
    for (const RealtimeSessionId h : std::vector<RealtimeSessionId>(hogs.begin(), hogs.end())) {
      (void)sup.Submit(h, {1});
    }
    sup.RunIteration();
    run.peak_used_blocks = std::max(run.peak_used_blocks, backend.pool().used_blocks);
    const Nanos next(std::chrono::milliseconds(ms + 1));
    if (clock.Now() < next) clock.SleepUntil(next);
  }
  return run;
}

TEST(SupervisorTest, FullKvHogsSendingBackToBackCannotTakeWhatAdmissionPromisedOthers) {
  const HogRun guarded = RunHogAttack(/*server_rules=*/true);
  EXPECT_GT(guarded.hogs_admitted, 10);
  EXPECT_GT(guarded.hogs_ended_at_budget, 0) << "hogs reach their 16-token budget in ~40 s";
  EXPECT_EQ(guarded.starved_or_short, 0);
  EXPECT_GT(guarded.victim_submitted, 1000);
  EXPECT_GE(guarded.victim_frames, guarded.victim_submitted - 2);  // 2 may still be in flight
  EXPECT_LE(guarded.peak_used_blocks, 64);

  const HogRun open = RunHogAttack(/*server_rules=*/false);
  EXPECT_GT(open.starved_or_short, 0) << "without the rules the same hogs fill the pool";
  EXPECT_EQ(open.hogs_ended_at_budget, 0);
}

// --- Work admission: each session priced by what it declares ---------------------------------

// c0 1 ms, c1 10 us/token, no KV term: a frame of a tokens in and o out costs (a + o) x 10 us of
// marginal work (the first iteration carries a + 1 tokens, each further one 1).
SupervisorOptions PricedOptions(const std::string& admission) {
  SupervisorOptions o;
  o.admission = admission;
  o.log_to_stderr = false;
  o.cost_model = CostModel{.c0_s = 0.001, .c1_s_per_token = 1e-5, .c2_s_per_kv_token = 0.0};
  o.reference_session = Spec(kv::KvPolicy::Window(64, 4));  // 6 + 2 tokens per 100 ms
  return o;
}

TEST(SupervisorTest, SessionsArePricedInUnitsOfTheReferenceSession) {
  CostModelBackend backend({.c0_s = 0.001, .c1_s_per_token = 1e-5}, 10000, 16);
  ManualClock clock;
  SupervisorOptions o = PricedOptions("aimd");
  o.aimd.initial_limit = 10;  // a budget of 10 reference sessions
  Supervisor sup(&backend, &clock, o);
  sup.Start();
  EXPECT_TRUE(sup.priced());
  SessionSpec heavy = Spec(kv::KvPolicy::Window(64, 4));
  heavy.input_tokens_per_frame = 30;  // 32 tokens a frame: 4x the reference's 8
  const Supervisor::AdmitResult h = sup.Admit(heavy, 0.0);
  ASSERT_TRUE(h.decision.admit);
  EXPECT_NEAR(h.work, 4.0, 1e-9);
  SessionSpec fast = Spec(kv::KvPolicy::Window(64, 4));
  fast.period_ms = fast.deadline_ms = 50.0;  // twice the rate: 2 units
  EXPECT_NEAR(sup.Admit(fast, 0.0).work, 2.0, 1e-9);
  EXPECT_NEAR(sup.active_work(), 6.0, 1e-9);
  // 6 of 10 units: a second heavy session (4) fits, a third does not, though only 3 sessions run.
  EXPECT_TRUE(sup.Admit(heavy, 0.0).decision.admit);
  const Supervisor::AdmitResult refused = sup.Admit(heavy, 0.0);
  EXPECT_FALSE(refused.decision.admit);
  EXPECT_EQ(refused.decision.reason, "limit");
  EXPECT_EQ(refused.decision.detail, "work 10.00 + 4.00 > budget 10 (3 sessions active)");
  // A reference session still fits? No: 10 of 10 units are taken.
  EXPECT_FALSE(sup.Admit(Spec(kv::KvPolicy::Window(64, 4)), 0.0).decision.admit);
  sup.End(h.id, 0.0, EndReason::kClient);  // frees its 4 units
  EXPECT_NEAR(sup.active_work(), 6.0, 1e-9);
  EXPECT_TRUE(sup.Admit(Spec(kv::KvPolicy::Window(64, 4)), 0.0).decision.admit);
}

TEST(SupervisorTest, TheDoorRefusesWhatNoBudgetCanServe) {
  CostModelBackend backend({.c0_s = 0.001, .c1_s_per_token = 1e-5}, 10000, 16);
  ManualClock clock;
  SupervisorOptions o = PricedOptions("aimd");
  o.work.min_deadline_ms = 5.0;
  Supervisor sup(&backend, &clock, o);
  sup.Start();
  // A deadline its own frame cannot meet: the lone frame takes 2 x 1 ms + 80 us, at most half of D.
  SessionSpec impossible = Spec(kv::KvPolicy::Window(64, 4));
  impossible.deadline_ms = 1e-300;
  Supervisor::AdmitResult r = sup.Admit(impossible, 0.0);
  EXPECT_FALSE(r.decision.admit);
  EXPECT_EQ(r.decision.reason, "deadline");
  EXPECT_EQ(r.decision.retry_after_ms, 0.0);  // the same request will never be admitted
  EXPECT_NE(r.decision.detail.find("deadline_ms 1e-300 is under"), std::string::npos)
      << r.decision.detail;
  // Over the calibrated floor (4.16 ms) but under the operator's 5 ms: the larger floor wins.
  impossible.deadline_ms = 4.5;
  EXPECT_EQ(sup.Admit(impossible, 0.0).decision.reason, "deadline");
  SessionSpec fast = Spec(kv::KvPolicy::Window(64, 4));
  fast.period_ms = 4.0;  // over the lone frame's 2.08 ms, under the operator's 5 ms
  fast.deadline_ms = 100.0;
  EXPECT_EQ(sup.Admit(fast, 0.0).decision.reason, "period");
  // Heavier than one session may be: 4094 + 2 tokens of 10 us every 50 ms is 0.82 of the engine.
  SessionSpec hog = Spec(kv::KvPolicy::Window(64, 4));
  hog.input_tokens_per_frame = 4094;
  hog.period_ms = 50.0;
  r = sup.Admit(hog, 0.0);
  EXPECT_EQ(r.decision.reason, "work");
  EXPECT_NE(r.decision.detail.find("0.8192 of the engine per second"), std::string::npos)
      << r.decision.detail;
  EXPECT_EQ(sup.admitted(), 0);
  EXPECT_EQ(sup.active_work(), 0.0);
}

TEST(SupervisorTest, WithoutACostModelSessionsCountAsOneAndTheOperatorsFloorHolds) {
  CostModelBackend backend({.c0_s = 0.001}, 10000, 16);
  ManualClock clock;
  SupervisorOptions o;
  o.admission = "static:2";
  o.log_to_stderr = false;
  o.work.min_deadline_ms = 20.0;
  Supervisor sup(&backend, &clock, o);
  sup.Start();
  EXPECT_FALSE(sup.priced());
  SessionSpec heavy = Spec(kv::KvPolicy::Window(64, 4));
  heavy.input_tokens_per_frame = 30;
  EXPECT_EQ(sup.Admit(heavy, 0.0).work, 1.0);
  SessionSpec tight = heavy;
  tight.deadline_ms = 10.0;
  EXPECT_EQ(sup.Admit(tight, 0.0).decision.reason, "deadline");
  EXPECT_TRUE(sup.Admit(heavy, 0.0).decision.admit);
  EXPECT_FALSE(sup.Admit(heavy, 0.0).decision.admit);  // two sessions: the static limit
}

}  // namespace
}  // namespace metronome::realtime
