// The real-time loop on a virtual clock: the silent failure of full KV (starved frames delivered on
// time, then a mute alarm) at the time the first-order model predicts, window KV never starving,
// compute overload showing as late frames, and the same behaviour with the real engine.
#include "metronome/realtime/realtime_loop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include "metronome/base/errors.h"
#include "metronome/engine/sampler.h"
#include "metronome/model/model.h"
#include "metronome/realtime/cost_model.h"
#include "metronome/serving/engine_backend.h"

namespace metronome::realtime {
namespace {

// The engine cases run the loop on the real runtime (serving, the module above realtime).
using serving::EngineBackend;

// Hands what the loop reports to the test's lambdas (each may be empty).
struct Observer final : SessionObserver {
  explicit Observer(RealtimeLoop& loop) { loop.set_observer(this); }
  std::function<void(const FrameRecord&)> frame;
  std::function<void(const SessionEnded&)> ended;
  void OnFrame(const FrameRecord& r) override {
    if (frame) frame(r);
  }
  void OnMuteAlarm(const MuteAlarm& /*alarm*/) override {}
  void OnSessionEnded(const SessionEnded& e) override {
    if (ended) ended(e);
  }
};

SessionSpec Spec(const kv::KvPolicy& policy, int a = 3, int o = 1) {
  SessionSpec s;
  s.period_ms = 80.0;
  s.deadline_ms = 80.0;  // resolved: the period
  s.input_tokens_per_frame = a;
  s.output_tokens_per_frame = o;
  s.policy = policy;
  return s;
}

// N sessions append (a + o) tokens per period each: rho(t) = N r t with r = tokens_per_s / pool,
// so the pool is full at t_sat = 1 / (N r).
TEST(RealtimeLoopTest, FullKvStarvesAtThePredictedTimeAndRaisesMuteAlarms) {
  const int n = 10;
  const int blocks = 1000;
  const int bt = 16;
  CostModelBackend backend({.c0_s = 0.002}, blocks, bt);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock,
                    {.mute_after_starved = 3, .pacing = {}, .max_step_tokens = 0, .prompt = {}});
  for (int i = 0; i < n; ++i) loop.AddSession(Spec(kv::KvPolicy::Full()));
  const double tokens_per_s = (3 + 1) / 0.080;
  const double r = tokens_per_s / (blocks * bt);
  const double t_sat = 1.0 / (n * r);  // 32 s
  loop.RunUntil(60.0);
  const LoopStats& st = loop.stats();
  ASSERT_FALSE(std::isnan(st.first_starved_at_s)) << "full KV must run out";
  EXPECT_NEAR(st.first_starved_at_s, t_sat, 0.1 * t_sat);
  EXPECT_GT(st.starved, 0);
  EXPECT_EQ(st.mute_alarms, n) << "every session goes mute once";
  EXPECT_EQ(st.late, 0) << "the failure is silent: frames arrive on time";
  EXPECT_EQ(loop.active_sessions(), n) << "no session is evicted";
}

TEST(RealtimeLoopTest, WindowKvWithTheSamePopulationNeverStarves) {
  const int n = 10;
  CostModelBackend backend({.c0_s = 0.002}, 1000, 16);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock);
  std::vector<RealtimeSessionId> ids;
  for (int i = 0; i < n; ++i) ids.push_back(loop.AddSession(Spec(kv::KvPolicy::Window(64, 4))));
  loop.RunUntil(120.0);
  const LoopStats& st = loop.stats();
  EXPECT_EQ(st.starved + st.short_frames, 0);
  EXPECT_EQ(st.mute_alarms, 0);
  EXPECT_GE(st.frames, n * 1499);
  EXPECT_EQ(st.ok, st.frames);
  const std::int64_t bound = kv::KvPolicy::Window(64, 4).MaxResidentBlocks(16);
  for (const auto id : ids) EXPECT_LE(loop.resident_blocks(id), bound);
}

TEST(RealtimeLoopTest, ComputeOverloadShowsAsLateFramesNotStarvation) {
  CostModelBackend backend({.c0_s = 0.100}, 1000, 16);  // every step takes longer than a period
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock);
  loop.AddSession(Spec(kv::KvPolicy::Window(64, 4), 2, 2));
  loop.RunUntil(5.0);
  EXPECT_GT(loop.stats().late, 0);
  EXPECT_EQ(loop.stats().ok, 0);
  EXPECT_EQ(loop.stats().starved, 0);
}

TEST(RealtimeLoopTest, FramesAreDeliveredInOrderWithTheirLatency) {
  CostModelBackend backend({.c0_s = 0.005}, 100, 16);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock);
  std::vector<FrameRecord> got;
  Observer obs(loop);
  obs.frame = [&](const FrameRecord& r) { got.push_back(r); };
  loop.AddSession(Spec(kv::KvPolicy::Window(32, 2), 4, 3));
  loop.RunUntil(1.0);
  ASSERT_GE(got.size(), 12u);
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].index, static_cast<std::int64_t>(i));
    EXPECT_EQ(got[i].tokens.size(), 3u);
    EXPECT_EQ(got[i].outcome, FrameOutcome::kOk);
    // Input prefill + 2 decodes, 5 ms each.
    EXPECT_NEAR(got[i].latency_ms, 15.0, 1e-6);
  }
}

TEST(RealtimeLoopTest, RejectsBadSpecs) {
  CostModelBackend backend({}, 10, 16);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock);
  SessionSpec s = Spec(kv::KvPolicy::Full());
  s.period_ms = 0;
  EXPECT_THROW(loop.AddSession(s), ConfigError);
  s = Spec(kv::KvPolicy::Window(0, 1));
  EXPECT_THROW(loop.AddSession(s), ConfigError);
}

// The real engine on synthetic:tiny, timed for real but on a virtual clock: once a small pool is
// exhausted, full-KV sessions get 0 tokens per frame; windowed sessions never do.
TEST(RealtimeLoopTest, RealEngineFullKvGoesMuteWindowKvDoesNot) {
  const model::Model m = model::MakeSyntheticModel("tiny", 3);
  for (const bool window : {false, true}) {
    engine::EngineOptions eo;
    eo.kv_blocks = 40;
    eo.block_tokens = 16;
    eo.num_threads = 1;  // an OpenMP team on a loaded 2-core box stalls for seconds
    engine::Engine eng(m, eo);
    EngineBackend backend(&eng, {});
    ManualClock clock;
    RealtimeLoop loop(&backend, &clock);
    for (int i = 0; i < 4; ++i) {
      loop.AddSession(Spec(window ? kv::KvPolicy::Window(32, 4) : kv::KvPolicy::Full(), 2, 1));
    }
    loop.RunUntil(8.0);  // 640 tokens of pool / (4 sessions x 37.5 tokens/s) ~ 4.3 s
    if (window) {
      EXPECT_EQ(loop.stats().starved, 0);
      EXPECT_GT(loop.stats().ok, 300);
    } else {
      EXPECT_GT(loop.stats().starved, 0);
      EXPECT_GT(loop.stats().mute_alarms, 0);
    }
  }
}

// Frames from a client (the server's path): each carries its own tokens and arrives when submitted.
TEST(RealtimeLoopTest, ExternalFramesCarryTheirTokensAndArePacedBySubmission) {
  CostModelBackend backend({.c0_s = 0.003}, 1000, 16);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock);
  SessionSpec spec = Spec(kv::KvPolicy::Window(64, 4), 3, 2);
  spec.external_frames = true;
  const RealtimeSessionId id = loop.AddSession(spec);
  std::vector<FrameRecord> got;
  Observer obs(loop);
  obs.frame = [&](const FrameRecord& r) { got.push_back(r); };

  loop.RunUntil(1.0);  // no frames submitted: nothing runs, nothing is delivered
  EXPECT_EQ(loop.stats().frames, 0);
  EXPECT_EQ(loop.stats().iterations, 0);

  EXPECT_EQ(loop.SubmitFrame(id, {1, 2, 3}), RealtimeLoop::SubmitResult::kOk);
  EXPECT_EQ(loop.SubmitFrame(id, {4}), RealtimeLoop::SubmitResult::kOk);
  EXPECT_EQ(loop.SubmitFrame(id, {5}), RealtimeLoop::SubmitResult::kTooEarly)
      << "two frames already waiting";
  EXPECT_EQ(loop.SubmitFrame(id, {}), RealtimeLoop::SubmitResult::kTooEarly)
      << "the queue is checked first";
  EXPECT_EQ(loop.SubmitFrame(id + 1, {1}), RealtimeLoop::SubmitResult::kUnknownSession);
  const RealtimeSessionId clocked = loop.AddSession(Spec(kv::KvPolicy::Full()));
  EXPECT_EQ(loop.SubmitFrame(clocked, {1}), RealtimeLoop::SubmitResult::kNotExternal);
  loop.EndSession(clocked);

  loop.RunUntil(1.1);
  ASSERT_EQ(got.size(), 2U);
  EXPECT_EQ(got[0].index, 0);
  EXPECT_EQ(got[1].index, 1);
  for (const FrameRecord& r : got) {
    EXPECT_EQ(r.outcome, FrameOutcome::kOk);
    EXPECT_EQ(r.tokens.size(), 2U);
    EXPECT_DOUBLE_EQ(r.arrival_s, 1.0);
  }
  // Frame 0: prefill of 3 tokens then 1 decode (2 steps); frame 1 waits for them, then 2 steps.
  EXPECT_NEAR(got[0].latency_ms, 6.0, 1e-6);
  EXPECT_NEAR(got[1].latency_ms, 12.0, 1e-6);
  // KV: 3 + 1 tokens of frame 0 (its last output is appended with frame 1), then 1 + 1 + 1.
  EXPECT_EQ(loop.resident_blocks(id), 1);
}

// A server stamps a frame when its network thread receives it; the time it then waited for the
// loop's thread counts: latency from that stamp, deadline from it too (late here, although the
// loop itself took 6 ms).
TEST(RealtimeLoopTest, AnExternalFrameStampedEarlierCountsItsQueueingDelay) {
  CostModelBackend backend({.c0_s = 0.003}, 1000, 16);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock);
  SessionSpec spec = Spec(kv::KvPolicy::Window(64, 4), 3, 2);
  spec.external_frames = true;
  spec.deadline_ms = 40.0;
  const RealtimeSessionId id = loop.AddSession(spec);
  std::vector<FrameRecord> got;
  Observer obs(loop);
  obs.frame = [&](const FrameRecord& r) { got.push_back(r); };
  clock.Advance(std::chrono::milliseconds(100));
  // Received at 60 ms, handed to the loop at 100 ms; a stamp from the future is clamped to now.
  ASSERT_EQ(loop.SubmitFrame(id, {1, 2, 3}, Nanos(std::chrono::milliseconds(60))),
            RealtimeLoop::SubmitResult::kOk);
  ASSERT_EQ(loop.SubmitFrame(id, {4}, Nanos(std::chrono::milliseconds(500))),
            RealtimeLoop::SubmitResult::kOk);
  loop.RunUntil(0.2);
  ASSERT_EQ(got.size(), 2U);
  EXPECT_DOUBLE_EQ(got[0].arrival_s, 0.06);
  EXPECT_NEAR(got[0].latency_ms, 46.0, 1e-6);  // 40 ms queued + 2 steps of 3 ms
  EXPECT_EQ(got[0].outcome, FrameOutcome::kLate);
  EXPECT_DOUBLE_EQ(got[1].arrival_s, 0.1);
  EXPECT_NEAR(got[1].latency_ms, 12.0, 1e-6);
  EXPECT_EQ(got[1].outcome, FrameOutcome::kOk);
}

// The client's tokens reach the real model: a frame's outputs are the engine's greedy continuation
// of exactly those tokens.
TEST(RealtimeLoopTest, ExternalFrameOutputsAreTheGreedyContinuationOfTheSubmittedTokens) {
  const model::Model m = model::MakeSyntheticModel("tiny", 3);
  engine::EngineOptions eo;
  eo.kv_blocks = 64;
  eo.num_threads = 1;
  engine::Engine reference(m, eo);
  const engine::SessionId ref = reference.OpenSession({});
  std::vector<TokenId> context = {1, 5, 9, 42};
  std::vector<TokenId> expected;
  for (int i = 0; i < 4; ++i) {
    const std::vector<TokenId> chunk = i == 0 ? context : std::vector<TokenId>{expected.back()};
    std::vector<engine::StepItemResult> results;
    reference.Step(std::vector<engine::StepItem>{{ref, chunk, engine::LogitsMode::kLast}},
                   &results);
    ASSERT_EQ(results[0].status, engine::StepStatus::kOk);
    const auto logits = reference.logits(results[0].first_logits_row);
    expected.push_back(
        static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }

  engine::Engine eng(m, eo);
  EngineBackend backend(&eng, {});
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock);
  SessionSpec spec = Spec(kv::KvPolicy::Full(), 4, 4);
  spec.external_frames = true;
  const RealtimeSessionId id = loop.AddSession(spec);
  std::vector<TokenId> got;
  Observer obs(loop);
  obs.frame = [&](const FrameRecord& r) { got = r.tokens; };
  ASSERT_EQ(loop.SubmitFrame(id, context), RealtimeLoop::SubmitResult::kOk);
  loop.RunUntil(1.0);
  EXPECT_EQ(got, expected);
}

// Records every step's items (session, tokens, whether a token was asked for) on top of a cost
// model: what the loop handed the backend.
class RecordingBackend final : public Backend {
 public:
  struct Item {
    BackendSessionId session = 0;
    std::vector<TokenId> tokens;
    bool want_next_token = false;
  };
  RecordingBackend(const CostModel& cost, std::int64_t blocks) : inner_(cost, blocks, 16) {}
  BackendSessionId Open(const kv::KvPolicy& policy, TokenPos max_context) override {
    return inner_.Open(policy, max_context);
  }
  void Close(BackendSessionId id) override { inner_.Close(id); }
  double Step(std::span<const BackendItem> items, std::vector<BackendItemResult>* out) override {
    std::vector<Item>& step = steps.emplace_back();
    for (const BackendItem& it : items) {
      step.push_back({it.session, {it.tokens.begin(), it.tokens.end()}, it.want_next_token});
    }
    return inner_.Step(items, out);
  }
  [[nodiscard]] kv::PoolStats pool() const override { return inner_.pool(); }
  [[nodiscard]] std::int64_t resident_blocks(BackendSessionId id) const override {
    return inner_.resident_blocks(id);
  }
  [[nodiscard]] std::vector<std::byte> ExportSession(BackendSessionId id) const override {
    return inner_.ExportSession(id);
  }
  BackendImport ImportSession(const kv::KvPolicy& policy, metronome::TokenPos max_context,
                              std::span<const std::byte> state) override {
    return inner_.ImportSession(policy, max_context, state);
  }
  [[nodiscard]] std::string model_identity() const override { return inner_.model_identity(); }
  [[nodiscard]] int vocab_size() const override { return inner_.vocab_size(); }
  [[nodiscard]] int block_tokens() const override { return inner_.block_tokens(); }

  // Every token each session was fed, in order, over all steps.
  [[nodiscard]] std::map<BackendSessionId, std::vector<TokenId>> FedTokens() const {
    std::map<BackendSessionId, std::vector<TokenId>> fed;
    for (const auto& step : steps) {
      for (const Item& it : step) {
        fed[it.session].insert(fed[it.session].end(), it.tokens.begin(), it.tokens.end());
      }
    }
    return fed;
  }

  std::vector<std::vector<Item>> steps;

 private:
  CostModelBackend inner_;
};

// A step budget changes how work is cut into steps, never what a session is fed: random shapes
// (prompts longer than the budget, inputs of 1 to 40 tokens, 0 to 3 outputs) fed through budgets
// of 1 to 64 tokens give every session the same token stream and every frame the same outputs as
// the unbudgeted loop, every step carries at most the budget, and an input cut into pieces asks
// for a token only after its last piece.
TEST(RealtimeLoopTest, AStepBudgetSplitsInputsWithoutChangingWhatSessionsAreFed) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<SessionSpec> specs;
    for (int i = 0; i < 6; ++i) {
      SessionSpec s = Spec(kv::KvPolicy::Window(48, 4), 1 + static_cast<int>(rng() % 40),
                           static_cast<int>(rng() % 4));
      s.period_ms = 40.0 + static_cast<double>(rng() % 60);
      s.deadline_ms = s.period_ms;
      s.phase_ms = static_cast<double>(rng() % 30);
      s.prompt.resize(rng() % 100);
      for (TokenId& t : s.prompt) t = static_cast<TokenId>(rng() % 1000);
      specs.push_back(s);
    }
    const int budget = 1 + static_cast<int>(rng() % 64);
    const auto run = [&](int max_step_tokens, RecordingBackend* backend) {
      ManualClock clock;
      RealtimeLoop loop(backend, &clock,
                        {.mute_after_starved = 3,
                         .pacing = {},
                         .max_step_tokens = max_step_tokens,
                         .prompt = {}});
      std::map<std::pair<RealtimeSessionId, std::int64_t>, std::vector<TokenId>> outputs;
      Observer obs(loop);
      obs.frame = [&](const FrameRecord& r) { outputs[{r.session, r.index}] = r.tokens; };
      for (const SessionSpec& s : specs) loop.AddSession(s);
      loop.RunUntil(2.0);
      EXPECT_EQ(loop.stats().starved + loop.stats().short_frames, 0);
      return outputs;
    };
    RecordingBackend whole({.c0_s = 1e-4, .c1_s_per_token = 1e-5}, 4096);
    RecordingBackend split({.c0_s = 1e-4, .c1_s_per_token = 1e-5}, 4096);
    const auto whole_outputs = run(0, &whole);
    const auto split_outputs = run(budget, &split);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", budget " + std::to_string(budget));
    // The budgeted run may finish fewer frames by t = 2 s (more steps): compare what both did.
    ASSERT_GE(split_outputs.size(), whole_outputs.size() / 2);
    for (const auto& [frame, tokens] : split_outputs) {
      const auto it = whole_outputs.find(frame);
      if (it != whole_outputs.end()) {
        EXPECT_EQ(tokens, it->second);
      }
    }
    const auto whole_fed = whole.FedTokens();
    for (const auto& [session, fed] : split.FedTokens()) {
      const std::vector<TokenId>& reference = whole_fed.at(session);
      const std::size_t n = std::min(fed.size(), reference.size());
      EXPECT_TRUE(
          std::equal(fed.begin(), fed.begin() + static_cast<std::ptrdiff_t>(n), reference.begin()))
          << "session " << session;
    }
    bool split_any = false;
    for (const auto& step : split.steps) {
      std::size_t tokens = 0;
      for (const auto& item : step) tokens += item.tokens.size();
      EXPECT_LE(tokens, static_cast<std::size_t>(budget));
      EXPECT_GE(tokens, 1U);
    }
    // An input cut into pieces: every piece but the last asks for no token.
    for (std::size_t k = 0; k + 1 < split.steps.size(); ++k) {
      for (const auto& item : split.steps[k]) {
        if (!item.want_next_token && item.tokens.size() > 0) split_any = true;
      }
    }
    EXPECT_TRUE(split_any || budget >= 40) << "some input must have been cut at this budget";
  }
}

// Over the budget the step takes frames earliest-deadline-first: of two sessions whose frames
// arrive together, the one due sooner is served first whatever its id.
TEST(RealtimeLoopTest, OverTheBudgetTheEarliestDeadlineGoesFirst) {
  RecordingBackend backend({.c0_s = 1e-3}, 1024);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock,
                    {.mute_after_starved = 3, .pacing = {}, .max_step_tokens = 8, .prompt = {}});
  SessionSpec relaxed = Spec(kv::KvPolicy::Window(64, 4), 8, 1);
  relaxed.deadline_ms = 80.0;
  SessionSpec urgent = relaxed;
  urgent.deadline_ms = 20.0;
  loop.AddSession(relaxed);  // id 1: served in id order without a budget
  loop.AddSession(urgent);
  loop.RunUntil(0.01);
  ASSERT_GE(backend.steps.size(), 2U);
  ASSERT_EQ(backend.steps[0].size(), 1U) << "8 tokens: one frame's input fills the budget";
  EXPECT_EQ(backend.steps[0][0].session, 2U) << "the urgent session's input goes first";
  EXPECT_EQ(backend.steps[1][0].session, 1U);
}

// A prompt's prefill takes only what the other ready frames leave of a step, whatever its
// deadline: a session that starts with a long prompt delays its own first frame, not the frames of
// the sessions already running.
TEST(RealtimeLoopTest, APromptTakesOnlyWhatOtherFramesLeaveOfAStep) {
  RecordingBackend backend({.c0_s = 1e-3, .c1_s_per_token = 1e-5}, 4096);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock,
                    {.mute_after_starved = 3, .pacing = {}, .max_step_tokens = 16, .prompt = {}});
  SessionSpec prompted = Spec(kv::KvPolicy::Window(256, 4), 1, 1);
  prompted.deadline_ms = 10.0;  // the earliest deadline of all
  prompted.prompt.assign(200, 7);
  SessionSpec victim = Spec(kv::KvPolicy::Window(256, 4), 4, 1);
  victim.deadline_ms = 80.0;
  const RealtimeSessionId p = loop.AddSession(prompted);
  const RealtimeSessionId v1 = loop.AddSession(victim);
  const RealtimeSessionId v2 = loop.AddSession(victim);
  loop.RunUntil(0.05);
  ASSERT_GE(backend.steps.size(), 3U);
  // Step 1: both victims' inputs (2 x 4 tokens) first, the prompt in the 8 tokens left.
  std::map<BackendSessionId, std::size_t> first;
  for (const auto& item : backend.steps[0]) first[item.session] = item.tokens.size();
  EXPECT_EQ(first[v1], 4U);
  EXPECT_EQ(first[v2], 4U);
  EXPECT_EQ(first[p], 8U);
  // Every step while the prompt is being fed serves the victims' ready work before it.
  for (const auto& step : backend.steps) {
    std::size_t tokens = 0;
    for (const auto& item : step) tokens += item.tokens.size();
    EXPECT_LE(tokens, 16U);
    bool prompt_seen = false;
    for (const auto& item : step) {
      if (item.session == p) prompt_seen = true;
      EXPECT_FALSE(prompt_seen && item.session != p) << "a victim item after the prompt's";
    }
  }
}

// The frames that wait for their session's own prompt are marked (FrameRecord::
// behind_own_prompt): the prompt's frame and every frame that arrived before the prompt was in,
// no other frame and no frame of a session without a prompt.
TEST(RealtimeLoopTest, FramesThatWaitForTheirOwnPromptAreMarked) {
  CostModelBackend backend({.c0_s = 1e-3, .c1_s_per_token = 1e-4}, 4096, 16);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock,
                    {.mute_after_starved = 3, .pacing = {}, .max_step_tokens = 16, .prompt = {}});
  SessionSpec prompted = Spec(kv::KvPolicy::Window(256, 4), 1, 1);
  prompted.prompt.assign(2000, 7);  // 125 steps of >= 2.6 ms: several periods
  const RealtimeSessionId p = loop.AddSession(prompted);
  const RealtimeSessionId plain = loop.AddSession(Spec(kv::KvPolicy::Window(256, 4), 1, 1));
  std::map<std::int64_t, FrameRecord> of_prompted;
  int plain_frames = 0;
  Observer obs(loop);
  obs.frame = [&](const FrameRecord& r) {
    if (r.session == p) of_prompted[r.index] = r;
    if (r.session == plain) {
      ++plain_frames;
      EXPECT_FALSE(r.behind_own_prompt) << "frame " << r.index << " of a session with no prompt";
    }
  };
  loop.RunUntil(2.0);
  ASSERT_TRUE(of_prompted.contains(0));
  EXPECT_GT(plain_frames, 10);
  const double prompt_in_s = of_prompted[0].delivered_s;
  int behind = 0;
  for (const auto& [index, r] : of_prompted) {
    EXPECT_EQ(r.behind_own_prompt, index == 0 || r.arrival_s < prompt_in_s) << "frame " << index;
    behind += r.behind_own_prompt ? 1 : 0;
  }
  EXPECT_GE(behind, 3) << "the prompt takes several periods";
  EXPECT_LT(behind, static_cast<int>(of_prompted.size()));
}

TEST(RealtimeLoopTest, ANegativeStepBudgetIsRefused) {
  CostModelBackend backend({}, 10, 16);
  ManualClock clock;
  EXPECT_THROW(
      RealtimeLoop(&backend, &clock,
                   {.mute_after_starved = 3, .pacing = {}, .max_step_tokens = -1, .prompt = {}}),
      ConfigError);
}

// A full-KV session at its context limit ends with an explicit error, never silently; the others
// go on.
TEST(RealtimeLoopTest, FullKvSessionAtItsContextLimitEndsWithAnError) {
  const model::Model m = model::MakeSyntheticModel("tiny", 3);
  engine::EngineOptions eo;
  eo.kv_blocks = 64;
  eo.num_threads = 1;
  engine::Engine eng(m, eo);
  EngineBackend backend(&eng, {}, /*max_context=*/40);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock,
                    {.mute_after_starved = 3, .pacing = {}, .max_step_tokens = 0, .prompt = {}});
  const RealtimeSessionId full = loop.AddSession(Spec(kv::KvPolicy::Full(), 7, 1));
  const RealtimeSessionId window = loop.AddSession(Spec(kv::KvPolicy::Window(16, 4), 7, 1));
  std::vector<std::pair<RealtimeSessionId, engine::StepStatus>> errors;
  Observer obs(loop);
  obs.ended = [&](const SessionEnded& e) {
    EXPECT_EQ(e.reason, EndReason::kContextFull);
    errors.emplace_back(e.session, e.status);
  };
  loop.RunUntil(2.0);
  // 8 tokens per frame into a 40-token context: the 6th frame does not fit.
  ASSERT_EQ(errors.size(), 1U);
  EXPECT_EQ(errors[0].first, full);
  EXPECT_EQ(errors[0].second, engine::StepStatus::kContextFull);
  EXPECT_EQ(loop.stats().context_full_sessions, 1);
  EXPECT_EQ(loop.active_sessions(), 1);
  EXPECT_EQ(loop.session_ids(), std::vector<RealtimeSessionId>{window});
  EXPECT_EQ(loop.stats().starved, 0);
  EXPECT_EQ(eng.pool_stats().num_sessions, 1) << "the ended session's blocks went back";
}

// The declared rate (FramePacing): an idle client may send burst_frames frames back to back, then
// one per period; a refused frame changes nothing; more tokens than declared are refused too.
TEST(RealtimeLoopTest, ExternalFramesFasterThanTheDeclaredPeriodAreRefusedBeyondTheBurst) {
  CostModelBackend backend({.c0_s = 0.0}, 1000, 16);  // steps take no time: the clock is the test's
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock);
  SessionSpec spec = Spec(kv::KvPolicy::Window(64, 4), 2, 1);
  spec.period_ms = 1000.0;
  spec.deadline_ms = 1000.0;  // resolved: the period
  spec.external_frames = true;
  spec.max_pending_frames = 64;  // the rate, not the queue, is what this test meets
  const RealtimeSessionId id = loop.AddSession(spec);
  // Default pacing at P = 1 s: tolerance max(3 P, 100 ms) = 3 s, 4 frames back to back.
  ASSERT_EQ(FramePacing{}.Tolerance(std::chrono::seconds(1)), std::chrono::seconds(3));
  EXPECT_EQ(loop.SubmitFrame(id, {}), RealtimeLoop::SubmitResult::kEmpty);
  EXPECT_EQ(loop.SubmitFrame(id, {1, 2, 3}), RealtimeLoop::SubmitResult::kTooMany);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(loop.SubmitFrame(id, {1, 2}), RealtimeLoop::SubmitResult::kOk) << i;
  }
  EXPECT_EQ(loop.SubmitFrame(id, {1}), RealtimeLoop::SubmitResult::kTooFast);
  clock.Advance(std::chrono::milliseconds(999));
  EXPECT_EQ(loop.SubmitFrame(id, {1}), RealtimeLoop::SubmitResult::kTooFast);
  clock.Advance(std::chrono::milliseconds(1));
  EXPECT_EQ(loop.SubmitFrame(id, {1}), RealtimeLoop::SubmitResult::kOk);
  EXPECT_EQ(loop.SubmitFrame(id, {1}), RealtimeLoop::SubmitResult::kTooFast);

  // A hog sending every millisecond for 60 s gets the declared rate plus the burst, no more.
  int accepted = 0;
  for (int ms = 0; ms < 60000; ++ms) {
    clock.Advance(std::chrono::milliseconds(1));
    accepted += loop.SubmitFrame(id, {1}) == RealtimeLoop::SubmitResult::kOk ? 1 : 0;
    loop.RunIteration();
  }
  EXPECT_EQ(accepted, 60);  // 1 per second: the burst was spent at t = 0
}

// A client on a drift-free clock whose frames reach the server up to the tolerance late (network
// jitter, a stalled thread) is never refused: property over random delays.
TEST(RealtimeLoopTest, JitterWithinTheToleranceIsNeverRefused) {
  for (const double period_ms : {10.0, 40.0, 80.0, 1000.0}) {
    CostModelBackend backend({.c0_s = 0.0001}, 1000, 16);
    ManualClock clock;
    RealtimeLoop loop(&backend, &clock);
    SessionSpec spec = Spec(kv::KvPolicy::Window(64, 4), 1, 1);
    spec.period_ms = period_ms;
    spec.deadline_ms = period_ms;  // resolved: the period
    spec.external_frames = true;
    spec.max_pending_frames = 1024;
    const RealtimeSessionId id = loop.AddSession(spec);
    const Nanos period(std::llround(period_ms * 1e6));
    const Nanos tolerance = FramePacing{}.Tolerance(period);
    std::mt19937_64 rng(static_cast<std::uint64_t>(period_ms));
    std::uniform_int_distribution<std::int64_t> delay(0, tolerance.count());
    // Arrival i = i * P + delay_i, submitted in arrival order.
    std::vector<Nanos> arrivals;
    for (int i = 0; i < 2000; ++i) arrivals.push_back(period * i + Nanos(delay(rng)));
    std::sort(arrivals.begin(), arrivals.end());
    for (const Nanos a : arrivals) {
      clock.SleepUntil(a);
      ASSERT_EQ(loop.SubmitFrame(id, {1}, a), RealtimeLoop::SubmitResult::kOk)
          << "period " << period_ms << " ms, arrival " << a.count() << " ns";
      while (loop.RunIteration()) {
      }
    }
  }
}

// An ended session leaves nothing in the loop: external sessions at once, clocked ones once their
// next arrival time has passed; the 8192-token prompt is not kept either way.
TEST(RealtimeLoopTest, EndedSessionsLeaveNothingBehind) {
  CostModelBackend backend({.c0_s = 0.001}, 4096, 16);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock);
  SessionSpec external = Spec(kv::KvPolicy::Window(64, 4), 2, 1);
  external.external_frames = true;
  external.prompt.assign(8192, 7);
  SessionSpec clocked = Spec(kv::KvPolicy::Window(64, 4), 2, 1);
  for (int i = 0; i < 100; ++i) {
    const RealtimeSessionId a = loop.AddSession(external);
    const RealtimeSessionId b = loop.AddSession(clocked);
    ASSERT_EQ(loop.SubmitFrame(a, {1, 2}), RealtimeLoop::SubmitResult::kOk);
    if (i % 2 == 0) loop.RunIteration();
    loop.EndSession(a);
    loop.EndSession(b);
  }
  LoopFootprint f = loop.footprint();
  EXPECT_EQ(f.sessions, 0);
  EXPECT_EQ(f.ready, 0);
  // Clocked sessions whose next arrival has not come yet wait for their arrivals_ entry (emptied:
  // no frames, no prompt); the external ones are gone.
  EXPECT_GT(f.retired, 0);
  EXPECT_LE(f.retired, 100);
  EXPECT_EQ(backend.pool().used_blocks, 0);
  loop.RunUntil(1.0);  // past every next arrival (period 80 ms)
  f = loop.footprint();
  EXPECT_EQ(f.retired, 0);
  EXPECT_EQ(f.arrivals, 0);
}

// A full-KV session with a context budget (what the Supervisor sets from admission) ends with
// kContextFull at it and never holds more than its blocks; a window session beside it goes on.
TEST(RealtimeLoopTest, AFullKvSessionEndsAtItsContextBudget) {
  CostModelBackend backend({.c0_s = 0.001}, 1000, 16);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock,
                    {.mute_after_starved = 3, .pacing = {}, .max_step_tokens = 0, .prompt = {}});
  SessionSpec full = Spec(kv::KvPolicy::Full(), 3, 1);
  full.max_context_tokens = 64;  // 4 blocks
  const RealtimeSessionId id = loop.AddSession(full);
  loop.AddSession(Spec(kv::KvPolicy::Window(16, 4), 3, 1));
  std::int64_t peak = 0;
  int errors = 0;
  Observer obs(loop);
  obs.ended = [&](const SessionEnded& e) {
    EXPECT_EQ(e.session, id);
    EXPECT_EQ(e.status, engine::StepStatus::kContextFull);
    EXPECT_EQ(e.reason, EndReason::kContextFull);
    ++errors;
  };
  obs.frame = [&](const FrameRecord& r) {
    if (r.session == id) peak = std::max(peak, r.resident_blocks);
  };
  loop.RunUntil(10.0);
  EXPECT_EQ(errors, 1);
  EXPECT_EQ(peak, 4);
  EXPECT_EQ(loop.active_sessions(), 1);
  EXPECT_EQ(loop.stats().starved, 0);
}

// A backend error other than the context limit (here a token id outside the vocabulary, which the
// loop leaves to its caller to check) ends the session as an error, not as a context-full session.
TEST(RealtimeLoopTest, ABackendErrorEndsTheSessionAsAnErrorNotAsContextFull) {
  const model::Model m = model::MakeSyntheticModel("tiny", 3);
  engine::EngineOptions eo;
  eo.kv_blocks = 64;
  eo.num_threads = 1;
  engine::Engine eng(m, eo);
  EngineBackend backend(&eng, {});
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock,
                    {.mute_after_starved = 3, .pacing = {}, .max_step_tokens = 0, .prompt = {}});
  SessionSpec spec = Spec(kv::KvPolicy::Window(16, 4), 2, 1);
  spec.external_frames = true;
  const RealtimeSessionId id = loop.AddSession(spec);
  std::vector<SessionEnded> errors;
  Observer obs(loop);
  obs.ended = [&](const SessionEnded& e) { errors.push_back(e); };
  ASSERT_EQ(loop.SubmitFrame(id, {1, backend.vocab_size()}), RealtimeLoop::SubmitResult::kOk);
  loop.RunUntil(0.5);
  ASSERT_EQ(errors.size(), 1U);
  EXPECT_EQ(errors[0].session, id);
  EXPECT_EQ(errors[0].status, engine::StepStatus::kInvalidRequest);
  EXPECT_EQ(errors[0].reason, EndReason::kError);
  EXPECT_EQ(loop.stats().context_full_sessions, 0) << "the session had room in its context";
  EXPECT_EQ(loop.stats().error_sessions, 1);
  EXPECT_EQ(loop.active_sessions(), 0);
}

// Logits that are not finite end only the session they belong to, with their own reason: token 7's
// embedding row is NaN, so a session fed it has NaN logits (greedy argmax would answer token 0 as
// if all were well); the session beside it in the same steps keeps its exact greedy outputs.
TEST(RealtimeLoopTest, NonFiniteLogitsEndOnlyTheirSessionWithTheirOwnReason) {
  model::Model m = model::MakeSyntheticModel("tiny", 3);
  constexpr TokenId kPoisoned = 7;
  float* embedding = m.weights->MutableFloats(m.weights->token_embedding);
  std::fill_n(embedding + static_cast<std::ptrdiff_t>(kPoisoned) * m.config.dim, m.config.dim,
              std::numeric_limits<float>::quiet_NaN());
  engine::EngineOptions eo;
  eo.kv_blocks = 64;
  eo.num_threads = 1;

  // The clean session's greedy continuation, computed alone.
  const std::vector<TokenId> clean = {1, 5, 9, 42};
  std::vector<TokenId> expected;
  {
    engine::Engine reference(m, eo);
    const engine::SessionId ref = reference.OpenSession({});
    for (int i = 0; i < 4; ++i) {
      const std::vector<TokenId> chunk = i == 0 ? clean : std::vector<TokenId>{expected.back()};
      std::vector<engine::StepItemResult> results;
      reference.Step(std::vector<engine::StepItem>{{ref, chunk, engine::LogitsMode::kLast}},
                     &results);
      ASSERT_EQ(results[0].status, engine::StepStatus::kOk);
      const auto logits = reference.logits(results[0].first_logits_row);
      ASSERT_TRUE(engine::AllFinite(logits));
      expected.push_back(
          static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
  }

  engine::Engine eng(m, eo);
  EngineBackend backend(&eng, {});
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock);
  SessionSpec spec = Spec(kv::KvPolicy::Full(), 4, 4);
  spec.external_frames = true;
  const RealtimeSessionId good = loop.AddSession(spec);
  const RealtimeSessionId bad = loop.AddSession(spec);
  std::map<RealtimeSessionId, std::vector<TokenId>> outputs;
  std::vector<SessionEnded> ended;
  Observer obs(loop);
  obs.frame = [&](const FrameRecord& r) { outputs[r.session] = r.tokens; };
  obs.ended = [&](const SessionEnded& e) { ended.push_back(e); };
  ASSERT_EQ(loop.SubmitFrame(good, clean), RealtimeLoop::SubmitResult::kOk);
  ASSERT_EQ(loop.SubmitFrame(bad, {1, kPoisoned, 9, 42}), RealtimeLoop::SubmitResult::kOk);
  loop.RunUntil(1.0);

  ASSERT_EQ(ended.size(), 1U);
  EXPECT_EQ(ended[0].session, bad);
  EXPECT_EQ(ended[0].status, engine::StepStatus::kNonFiniteLogits);
  EXPECT_EQ(ended[0].reason, EndReason::kNonFiniteLogits);
  EXPECT_EQ(ToString(ended[0].reason), "nonfinite_logits");
  EXPECT_FALSE(outputs.contains(bad)) << "no frame of the poisoned session is delivered";
  EXPECT_EQ(outputs[good], expected);
  EXPECT_EQ(loop.stats().error_sessions, 1);
  EXPECT_EQ(loop.active_sessions(), 1);
}

}  // namespace
}  // namespace metronome::realtime
