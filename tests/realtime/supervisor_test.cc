// The supervisor's admission bookkeeping: what a session is projected to hold, and how memory
// admission uses it.
#include "metronome/realtime/supervisor.h"

#include <gtest/gtest.h>

#include "metronome/base/errors.h"

namespace metronome::realtime {
namespace {

SessionSpec Spec(const kv::KvPolicy& policy) {
  SessionSpec s;
  s.period_ms = 100.0;
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
  sup.End(1, 0.0);
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
  sup.End(1, 0.0);
  EXPECT_TRUE(sup.Admit(Spec(kv::KvPolicy::Window(64, 4)), 0.0).decision.admit);
  SupervisorOptions bad = o;
  bad.max_sessions = -1;
  EXPECT_THROW(bad.Validate(), ConfigError);
}

}  // namespace
}  // namespace metronome::realtime
