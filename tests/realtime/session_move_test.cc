// Moving a session: its state out of one loop (RealtimeLoop::ExportSession), through the one
// binary form (session_state.h), into a fresh loop on another engine (ImportSession), gives
// exactly the tokens the session would have produced uninterrupted: greedy and sampled, full KV
// and window KV (absolute and rolling positions, across the window's wrap), on a synthetic model
// and on the real stories260K. And every bad blob is refused with the check that caught it.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <variant>
#include <vector>

#include "metronome/base/byte_io.h"
#include "metronome/base/clock.h"
#include "metronome/engine/engine.h"
#include "metronome/model/model.h"
#include "metronome/realtime/cost_model.h"
#include "metronome/realtime/realtime_loop.h"
#include "metronome/realtime/session_state.h"
#include "metronome/serving/engine_backend.h"
#include "support/shared_data.h"

namespace metronome::realtime {
namespace {

struct Collector final : SessionObserver {
  std::vector<FrameRecord> frames;
  void OnFrame(const FrameRecord& r) override { frames.push_back(r); }
  void OnMuteAlarm(const MuteAlarm& /*alarm*/) override {}
  void OnSessionEnded(const SessionEnded& /*e*/) override {}
};

// One engine, its backend and a loop on a manual clock: what one replica holds.
struct Replica {
  Replica(const model::Model& m, const engine::SamplerOptions& sampling, int dummy_sessions)
      : engine(m, Options()), backend(&engine, sampling), loop(&backend, &clock) {
    loop.set_observer(&observer);
    // Other sessions first, so the moved session's blocks land elsewhere in this pool.
    for (int i = 0; i < dummy_sessions; ++i) {
      SessionSpec spec = Spec(kv::KvPolicy::Window(16, 0));
      const RealtimeSessionId id = loop.AddSession(spec);
      Frame(id, {1, 2, 3});
    }
  }
  static engine::EngineOptions Options() {
    engine::EngineOptions o;
    o.kv_blocks = 256;
    o.block_tokens = 8;
    o.num_threads = 1;
    return o;
  }
  static SessionSpec Spec(const kv::KvPolicy& policy) {
    SessionSpec s;
    s.period_ms = 10.0;
    s.deadline_ms = 10.0;
    s.input_tokens_per_frame = 3;
    s.output_tokens_per_frame = 2;
    s.policy = policy;
    s.external_frames = true;
    s.max_pending_frames = 1;
    return s;
  }
  // Submits one frame and runs the loop until its result; returns the output tokens.
  std::vector<TokenId> Frame(RealtimeSessionId id, std::vector<TokenId> input) {
    clock.Advance(FromMs(10.0));
    const std::size_t before = observer.frames.size();
    EXPECT_EQ(loop.SubmitFrame(id, std::move(input)), RealtimeLoop::SubmitResult::kOk);
    for (int i = 0; i < 100 && observer.frames.size() == before; ++i) loop.RunIteration();
    EXPECT_EQ(observer.frames.size(), before + 1);
    return observer.frames.empty() ? std::vector<TokenId>{} : observer.frames.back().tokens;
  }

  engine::Engine engine;
  serving::EngineBackend backend;
  ManualClock clock;
  RealtimeLoop loop;
  Collector observer;
};

std::vector<TokenId> InputOf(int frame, int vocab) {
  return {static_cast<TokenId>((frame * 7 + 3) % vocab),
          static_cast<TokenId>((frame * 13 + 5) % vocab),
          static_cast<TokenId>((frame * 29 + 11) % vocab)};
}

struct MoveCase {
  std::string name;
  kv::KvPolicy policy;
  float temperature = 0.0f;
  bool prompt = false;
};

// F frames uninterrupted on one replica; the same inputs on a second replica for k frames, the
// session moved to a third, the rest there: the same outputs, frame for frame.
void CheckMoveIsExact(const model::Model& m, const MoveCase& c, int frames, int move_at) {
  SCOPED_TRACE(c.name);
  const engine::SamplerOptions sampling{.temperature = c.temperature, .top_p = 0.95f, .seed = 7};
  SessionSpec spec = Replica::Spec(c.policy);
  if (c.prompt) spec.prompt = {5, 9, 17, 33, 65};
  const int vocab = m.config.vocab_size;

  Replica whole(m, sampling, 0);
  const RealtimeSessionId a = whole.loop.AddSession(spec);
  std::vector<std::vector<TokenId>> expected;
  for (int f = 0; f < frames; ++f) expected.push_back(whole.Frame(a, InputOf(f, vocab)));

  Replica origin(m, sampling, 1);
  Replica target(m, sampling, 3);
  const RealtimeSessionId b = origin.loop.AddSession(spec);
  std::vector<std::vector<TokenId>> got;
  for (int f = 0; f < move_at; ++f) got.push_back(origin.Frame(b, InputOf(f, vocab)));
  SessionState state;
  ASSERT_TRUE(origin.loop.ExportSession(b, &state));
  EXPECT_EQ(state.next_frame, move_at);
  const std::vector<std::byte> bytes = EncodeSessionState(state, origin.backend.model_identity());
  origin.loop.EndSession(b);
  auto decoded = DecodeSessionState(bytes, target.backend.model_identity());
  ASSERT_TRUE(std::holds_alternative<SessionState>(decoded))
      << std::get<SessionStateError>(decoded).message;
  RealtimeSessionId moved = 0;
  const BackendImport imported = target.loop.ImportSession(std::get<SessionState>(decoded), &moved);
  ASSERT_TRUE(imported.ok()) << imported.error;
  EXPECT_EQ(target.loop.next_frame(moved), move_at);
  for (int f = move_at; f < frames; ++f) got.push_back(target.Frame(moved, InputOf(f, vocab)));
  ASSERT_EQ(got.size(), expected.size());
  for (int f = 0; f < frames; ++f) EXPECT_EQ(got[f], expected[f]) << "frame " << f;
}

std::vector<MoveCase> Cases() {
  using kv::KvPolicy;
  using kv::PositionMode;
  return {
      {"full, greedy", KvPolicy::Full(), 0.0f, false},
      {"full, sampled, prompt", KvPolicy::Full(), 0.9f, true},
      {"window 24 + 4 sinks, absolute, greedy", KvPolicy::Window(24, 4), 0.0f, false},
      {"window 24 + 4 sinks, rolling, greedy", KvPolicy::Window(24, 4, PositionMode::kRolling),
       0.0f, false},
      {"window 24 + 4 sinks, rolling, sampled, prompt",
       KvPolicy::Window(24, 4, PositionMode::kRolling), 0.9f, true},
      {"window 20, no sinks, rolling, sampled", KvPolicy::Window(20, 0, PositionMode::kRolling),
       0.9f, false},
  };
}

// 5 tokens a frame: at frame 12 a 24-token window has wrapped twice, and the frames after the move
// wrap it again.
TEST(SessionMoveTest, SyntheticModelContinuesExactly) {
  const model::Model m = model::MakeSyntheticModel("tiny", 1234, 1);
  for (const MoveCase& c : Cases()) CheckMoveIsExact(m, c, 20, 12);
}

TEST(SessionMoveTest, Stories260KContinuesExactly) {
  const std::string bin = testing::SharedModelPath("stories260K.bin");
  const std::string tok = testing::SharedModelPath("tok512.bin");
  if (bin.empty() || tok.empty()) GTEST_SKIP() << "../shared/models/stories260K.bin not found";
  const model::Model m = model::LoadModel(bin, tok);
  for (const MoveCase& c : Cases()) CheckMoveIsExact(m, c, 16, 7);
}

TEST(SessionMoveTest, MovingBeforeTheFirstFrameKeepsThePrompt) {
  const model::Model m = model::MakeSyntheticModel("tiny", 1234, 1);
  MoveCase c{"prompt not yet fed", kv::KvPolicy::Window(24, 4, kv::PositionMode::kRolling), 0.0f,
             true};
  CheckMoveIsExact(m, c, 6, 0);
}

TEST(SessionMoveTest, ASessionWithAFrameInFlightDoesNotExport) {
  const model::Model m = model::MakeSyntheticModel("tiny", 1234, 1);
  Replica r(m, {}, 0);
  const RealtimeSessionId id = r.loop.AddSession(Replica::Spec(kv::KvPolicy::Window(24, 4)));
  ASSERT_EQ(r.loop.SubmitFrame(id, {1, 2, 3}), RealtimeLoop::SubmitResult::kOk);
  SessionState state;
  EXPECT_TRUE(r.loop.HasFrames(id));
  EXPECT_FALSE(r.loop.ExportSession(id, &state));
  EXPECT_FALSE(r.loop.ExportSession(id + 100, &state)) << "unknown session";
}

// ---------------------------------------------------------------------------------------------
// The binary form's refusals.

std::vector<std::byte> SimulatedState(std::string* identity) {
  CostModelBackend backend({.c0_s = 0.001}, 64, 16);
  ManualClock clock;
  RealtimeLoop loop(&backend, &clock);
  SessionSpec spec = Replica::Spec(kv::KvPolicy::Window(32, 4));
  const RealtimeSessionId id = loop.AddSession(spec);
  EXPECT_EQ(loop.SubmitFrame(id, {1, 2, 3}), RealtimeLoop::SubmitResult::kOk);
  loop.RunUntil(0.1);
  SessionState state;
  EXPECT_TRUE(loop.ExportSession(id, &state));
  state.frames.Count(FrameOutcome::kOk);
  *identity = backend.model_identity();
  return EncodeSessionState(state, *identity);
}

SessionStateError::Kind RefusalOf(const std::vector<std::byte>& bytes, const std::string& identity,
                                  std::string* message) {
  auto decoded = DecodeSessionState(bytes, identity);
  if (std::holds_alternative<SessionState>(decoded)) {
    *message = "accepted";
    return static_cast<SessionStateError::Kind>(255);
  }
  *message = std::get<SessionStateError>(decoded).message;
  return std::get<SessionStateError>(decoded).kind;
}

TEST(SessionStateTest, RoundTripsEveryField) {
  std::string identity;
  const std::vector<std::byte> bytes = SimulatedState(&identity);
  auto decoded = DecodeSessionState(bytes, identity);
  ASSERT_TRUE(std::holds_alternative<SessionState>(decoded));
  const SessionState& s = std::get<SessionState>(decoded);
  EXPECT_EQ(s.next_frame, 1);
  EXPECT_TRUE(s.prompt_fed);
  EXPECT_GE(s.pending_output, 0);
  EXPECT_EQ(s.frames.ok, 1);
  EXPECT_EQ(s.frames.frames, 1);
  EXPECT_EQ(s.spec.policy.window, 32);
  EXPECT_EQ(s.spec.policy.sinks, 4);
  EXPECT_EQ(s.spec.input_tokens_per_frame, 3);
  EXPECT_EQ(s.spec.output_tokens_per_frame, 2);
  EXPECT_DOUBLE_EQ(s.spec.period_ms, 10.0);
  EXPECT_TRUE(s.spec.external_frames);
  EXPECT_EQ(EncodeSessionState(s, identity), bytes) << "decode then encode is the identity";
}

TEST(SessionStateTest, EveryFlippedByteIsRefusedAsCorrupt) {
  std::string identity;
  const std::vector<std::byte> bytes = SimulatedState(&identity);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    std::vector<std::byte> bad = bytes;
    bad[i] ^= std::byte{0x5a};
    std::string message;
    const auto kind = RefusalOf(bad, identity, &message);
    // The version field is checked before the checksum, and says which version it saw.
    EXPECT_TRUE(kind == SessionStateError::Kind::kCorrupt ||
                kind == SessionStateError::Kind::kVersion)
        << "byte " << i << ": " << message;
  }
}

TEST(SessionStateTest, EveryTruncationIsRefused) {
  std::string identity;
  const std::vector<std::byte> bytes = SimulatedState(&identity);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    std::string message;
    const auto kind = RefusalOf({bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)},
                                identity, &message);
    EXPECT_EQ(kind, SessionStateError::Kind::kCorrupt) << n << " bytes: " << message;
  }
}

TEST(SessionStateTest, NamesTheForeignModelAndTheVersion) {
  std::string identity;
  std::vector<std::byte> bytes = SimulatedState(&identity);
  std::string message;
  EXPECT_EQ(RefusalOf(bytes, "m-0123456789abcdef", &message),
            SessionStateError::Kind::kForeignModel);
  EXPECT_NE(message.find("m-0123456789abcdef"), std::string::npos) << message;
  EXPECT_NE(message.find(identity), std::string::npos) << message;
  // Version 2 with a checksum that matches: refused for the version, naming it.
  bytes[8] = std::byte{2};
  std::string msg2;
  EXPECT_EQ(RefusalOf(bytes, identity, &msg2), SessionStateError::Kind::kVersion);
  EXPECT_NE(msg2.find("version = 2"), std::string::npos) << msg2;
}

TEST(SessionStateTest, AWellFormedStateWithAnImpossibleSpecIsInvalid) {
  CostModelBackend backend({.c0_s = 0.001}, 64, 16);
  SessionState state;
  state.spec = Replica::Spec(kv::KvPolicy::Window(32, 4));
  state.spec.period_ms = -5.0;  // no session has this
  state.backend = {std::byte{1}};
  std::string message;
  EXPECT_EQ(RefusalOf(EncodeSessionState(state, "x"), "x", &message),
            SessionStateError::Kind::kInvalid);
  EXPECT_NE(message.find("period_ms"), std::string::npos) << message;
}

TEST(SessionStateTest, ABackendRefusesKvOfAnotherLayoutOrType) {
  std::string identity;
  CostModelBackend origin({.c0_s = 0.001}, 64, 16);
  ManualClock clock;
  RealtimeLoop loop(&origin, &clock);
  const RealtimeSessionId id = loop.AddSession(Replica::Spec(kv::KvPolicy::Window(32, 4)));
  for (int f = 1; f <= 4; ++f) {  // 20 tokens: two blocks of 16
    ASSERT_EQ(loop.SubmitFrame(id, {1, 2, 3}), RealtimeLoop::SubmitResult::kOk);
    loop.RunUntil(0.1 * f);
  }
  const std::vector<std::byte> kv = origin.ExportSession(1);
  ASSERT_FALSE(kv.empty());
  CostModelBackend other_blocks({.c0_s = 0.001}, 64, 32);
  const BackendImport refused = other_blocks.ImportSession(kv::KvPolicy::Window(32, 4), 0, kv);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.error.find("block_tokens = 16, this pool's is 32"), std::string::npos)
      << refused.error;
  CostModelBackend small({.c0_s = 0.001}, 1, 16);
  const BackendImport full = small.ImportSession(kv::KvPolicy::Window(32, 4), 0, kv);
  EXPECT_TRUE(full.pool_exhausted);
  // A snapshot that claims a window the policy does not keep.
  CostModelBackend same({.c0_s = 0.001}, 64, 16);
  const BackendImport wrong_policy = same.ImportSession(kv::KvPolicy::Window(8, 0), 0, kv);
  EXPECT_FALSE(wrong_policy.ok());
  EXPECT_NE(wrong_policy.error.find("kv: "), std::string::npos) << wrong_policy.error;
}

TEST(ByteIoTest, Crc32MatchesTheStandardCheckValue) {
  const std::string text = "123456789";
  EXPECT_EQ(base::Crc32(std::as_bytes(std::span<const char>(text.data(), text.size()))),
            0xCBF43926u);
}

}  // namespace
}  // namespace metronome::realtime
