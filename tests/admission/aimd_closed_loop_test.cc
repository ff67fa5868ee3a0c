// Closed-loop tests: the AIMD controller admitting sessions into a synthetic plant on a virtual
// clock. Every tick (one frame period) every active session emits one frame whose latency is
// plant(N) + jitter; arrivals come faster than capacity, sessions end after their drawn duration
// and never earlier (the controller has no way to evict). Deterministic: a fixed-seed generator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "metronome/admission/aimd_controller.h"
#include "metronome/admission/gradient2_controller.h"

namespace metronome::admission {
namespace {

constexpr double kPeriodMs = 80.0;  // the default scenario's frame period = deadline

// splitmix64 + a 53-bit uniform in [0, 1): the same numbers on every standard library.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  double Uniform() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }

 private:
  std::uint64_t state_;
};

// How a refused arrival behaves.
enum class Retry : std::uint8_t {
  kNone,         // goes away
  kFixedPeriod,  // asks again one period later, ignoring the hint (the storm)
  kBackoff,      // RetryBackoffMs from the hint, as loadgen does
};

struct Scenario {
  // Frame latency at N active sessions before jitter, ms (a pool overflow is handled separately).
  std::function<double(std::int64_t)> latency_ms;
  double period_ms = kPeriodMs;  // one tick per period; the deadline is the period
  // Every session's price in units of work (SessionRequest::work): the controller's limit is then
  // a budget of units while latency_ms still reads the session count.
  double session_work = 1.0;
  // Latency step: from step_at_s on (until step_end_s, when that is >= 0), every frame's latency
  // is multiplied by step_factor.
  double step_at_s = -1.0;
  double step_end_s = -1.0;
  double step_factor = 1.0;
  Retry retry = Retry::kNone;
  double patience_s = 10.0;        // retrying arrivals give up after this long
  double backoff_cap_ms = 5000.0;  // Retry::kBackoff's cap
  // Window KV: every session holds projected_blocks from its first frame (its bound), so the pool
  // fits exactly total_blocks / projected_blocks sessions. Otherwise the full-mode growth below.
  bool window_kv = false;
  // Window KV whose windows fill as sessions run (the simulator's and the engine's): a session
  // holds min(projected_blocks, ceil((prompt + age * tokens_per_s) / block_tokens)) blocks, and
  // every frame costs kv_latency_ms more per unit of the sessions' mean fill (held / projected).
  bool window_fills = false;
  double kv_latency_ms = 0.0;
  double jitter_ms = 2.0;       // uniform in [0, jitter_ms) per frame
  double arrivals_per_s = 3.0;  // Poisson; far above what the plant can serve
  double min_session_s = 20.0;  // session durations uniform in [min, max]
  double max_session_s = 60.0;
  double duration_s = 600.0;
  // KV model for the cliff: 0 disables it. Each session holds
  // ceil((prompt + age * tokens_per_s) / block_tokens) blocks; while the sessions' demand exceeds
  // total_blocks every frame stalls to stall_latency_ms.
  std::int64_t total_blocks = 0;
  std::int64_t projected_blocks = 0;
  double prompt_tokens = 50.0;
  double tokens_per_s = 12.5;
  double block_tokens = 16.0;
  double stall_latency_ms = 200.0;
  // Window KV's wall: an overflow stalls only the sessions the pool cannot hold (the newest,
  // total_blocks / projected_blocks on), the rest run at the plant's latency, so with many sessions
  // the p99 stays low and only the miss ratio sees the wall.
  bool stall_excess_only = false;
  // Engine stalls (another process taking the cores): each tick, with probability
  // spike_per_tick, every frame of the tick is delayed by U[spike_min_ms, spike_max_ms), however
  // many sessions run. Drawn from their own generator (spike_seed), so the other draws are the
  // same with and without them.
  double spike_per_tick = 0.0;
  double spike_min_ms = 0.0;
  double spike_max_ms = 0.0;
  std::uint64_t spike_seed = 7;
  // A continuously batching engine's queue (0: none, and no engine steps are reported). Each
  // session adds work_per_session of the engine's time, so the work utilization is
  // u = N x work_per_session; a stall's length joins a backlog that drains at tick x (1 - u) a
  // tick (grows when u > 1), and every frame waits for the backlog: near u = 1 a stall becomes an
  // episode about 1 / (1 - u) times its length, while the ticks between episodes stay calm. The
  // engine's steps go to the controller: four a tick, of 10/20/30/40% of the tick's tokens
  // (tokens_per_session_tick a session), each costing step_fixed_ms plus its tokens' share.
  double work_per_session = 0.0;
  double tokens_per_session_tick = 16.0;
  double step_fixed_ms = 0.5;
  // Speed phases (a machine whose cores are shared): from slow_first_s on, for slow_for_s out of
  // every slow_every_s, each session's work is slow_factor times work_per_session.
  double slow_factor = 1.0;
  double slow_first_s = 0.0;
  double slow_every_s = 0.0;
  double slow_for_s = 0.0;
};

// A session's share of the engine's time at now_s (Scenario::work_per_session, speed phases).
double WorkPerSession(const Scenario& s, double now_s) {
  if (s.slow_every_s <= 0.0 || now_s < s.slow_first_s) return s.work_per_session;
  const double into = std::fmod(now_s - s.slow_first_s, s.slow_every_s);
  return into < s.slow_for_s ? s.slow_factor * s.work_per_session : s.work_per_session;
}

// The backlog a tick's frames wait for, ms, after this tick's stall (Scenario::work_per_session).
double NextBacklogMs(const Scenario& s, double now_s, std::int64_t n, double spike_ms,
                     double backlog_ms) {
  if (s.work_per_session <= 0.0) return 0.0;
  const double u = WorkPerSession(s, now_s) * static_cast<double>(n);
  return std::max(0.0, backlog_ms - s.period_ms * (1.0 - u)) + spike_ms;
}

struct Trace {
  std::vector<std::int64_t> limit;   // per tick
  std::vector<std::int64_t> active;  // per tick, after admissions
  std::int64_t peak_active = 0;
  std::int64_t num_admitted = 0;
  std::int64_t num_ended = 0;
  std::int64_t num_frames = 0;
  std::int64_t num_misses = 0;
  std::int64_t num_overflow_ticks = 0;
  std::int64_t num_kv_guard_rejections = 0;
  std::int64_t ticks_with_limit_below_active = 0;
  std::int64_t num_arrivals = 0;    // distinct clients
  std::int64_t num_rejections = 0;  // every refusal, retries included
  std::int64_t num_abandoned = 0;
  std::int64_t max_limit = 0;
  std::vector<LimitChange> changes;
  double tick_s = kPeriodMs / 1000.0;
};

std::int64_t BlocksAt(const Scenario& s, double age_s) {
  if (s.window_kv && !s.window_fills) return s.projected_blocks;
  const auto grown = static_cast<std::int64_t>(
      std::ceil((s.prompt_tokens + age_s * s.tokens_per_s) / s.block_tokens));
  return s.window_fills ? std::min(grown, s.projected_blocks) : grown;
}

// This tick's engine stall, ms (0 without one).
double SpikeMs(const Scenario& s, Rng& spike_rng) {
  if (s.spike_per_tick <= 0.0 || spike_rng.Uniform() >= s.spike_per_tick) return 0.0;
  return s.spike_min_ms + (s.spike_max_ms - s.spike_min_ms) * spike_rng.Uniform();
}

// The engine steps of a tick with n sessions (Scenario::work_per_session), ending by now_s.
void ReportSteps(const Scenario& s, std::int64_t n, double now_s, AdmissionController& c,
                 StepCostFit& fit) {
  if (n == 0) return;
  const double tokens = s.tokens_per_session_tick * static_cast<double>(n);
  const double per_token_s =
      WorkPerSession(s, now_s) * s.period_ms / 1000.0 / s.tokens_per_session_tick;
  for (const double share : {0.1, 0.2, 0.3, 0.4}) {
    const auto step_tokens = static_cast<std::int64_t>(std::llround(share * tokens));
    const double step_s = s.step_fixed_ms / 1000.0 + per_token_s * static_cast<double>(step_tokens);
    fit.OnStep(now_s, step_s, step_tokens);
    c.OnStep(step_s, step_tokens, fit.Estimate());
  }
}

Trace Simulate(const Scenario& s, AdmissionController& c, std::uint64_t seed = 1) {
  struct Session {
    double start_s;
    double end_s;
  };
  struct Asking {
    double t_s;
    double first_s;
    std::int64_t refusals;
  };
  Rng rng(seed);
  Rng spike_rng(s.spike_seed);
  std::vector<Session> sessions;
  std::vector<Asking> asking;  // clients due to ask at t_s
  Trace trace;
  const double tick_s = s.period_ms / 1000.0;
  const double deadline_ms = s.period_ms;
  trace.tick_s = tick_s;
  double next_arrival_s = 0.0;
  double backlog_ms = 0.0;
  StepCostFit step_cost;  // the engine's, as the Supervisor keeps it
  const auto num_ticks = static_cast<std::int64_t>(s.duration_s / tick_s);
  auto state_at = [&](double now_s) {
    SystemState st{.active_sessions = static_cast<std::int64_t>(sessions.size()),
                   .active_work = static_cast<double>(sessions.size()) * s.session_work};
    if (s.total_blocks > 0) {
      std::int64_t used = 0;
      std::int64_t promised = 0;
      for (const Session& x : sessions) {
        const std::int64_t b = BlocksAt(s, now_s - x.start_s);
        used += b;
        promised += std::max<std::int64_t>(0, s.projected_blocks - b);
      }
      st.total_blocks = s.total_blocks;
      st.free_blocks = std::max<std::int64_t>(0, s.total_blocks - used);
      st.reserved_blocks = promised;
    }
    return st;
  };
  for (std::int64_t k = 0; k < num_ticks; ++k) {
    const double now_s = static_cast<double>(k) * tick_s;
    // The engine's steps of the tick that just ended, before any decision now.
    if (s.work_per_session > 0.0) {
      ReportSteps(s, static_cast<std::int64_t>(sessions.size()), now_s, c, step_cost);
    }
    // Sessions end only when their time is up.
    const auto before = static_cast<std::int64_t>(sessions.size());
    std::erase_if(sessions, [&](const Session& x) { return x.end_s <= now_s; });
    trace.num_ended += before - static_cast<std::int64_t>(sessions.size());
    // Arrivals since the last tick, then the retries that are due, in time order.
    while (next_arrival_s <= now_s) {
      asking.push_back({next_arrival_s, next_arrival_s, 0});
      ++trace.num_arrivals;
      next_arrival_s += -std::log(1.0 - rng.Uniform()) / s.arrivals_per_s;
    }
    std::stable_sort(asking.begin(), asking.end(),
                     [](const Asking& a, const Asking& b) { return a.t_s < b.t_s; });
    std::vector<Asking> later;
    for (Asking& a : asking) {
      if (a.t_s > now_s) {
        later.push_back(a);
        continue;
      }
      const SessionRequest r{.period_ms = s.period_ms,
                             .deadline_ms = deadline_ms,
                             .projected_blocks = s.projected_blocks,
                             .work = s.session_work};
      const Decision d = c.Decide(r, state_at(now_s), now_s);
      if (d.admit) {
        const double len_s = s.min_session_s + (s.max_session_s - s.min_session_s) * rng.Uniform();
        sessions.push_back({now_s, now_s + len_s});
        ++trace.num_admitted;
        continue;
      }
      ++trace.num_rejections;
      if (d.reason == "kv_guard") ++trace.num_kv_guard_rejections;
      ++a.refusals;
      const double wait_ms = s.retry == Retry::kBackoff
                                 ? RetryBackoffMs(d.retry_after_ms, a.refusals, s.backoff_cap_ms)
                                 : s.period_ms;
      a.t_s = now_s + wait_ms / 1000.0;
      if (s.retry == Retry::kNone) continue;
      if (a.t_s - a.first_s > s.patience_s) {
        ++trace.num_abandoned;
        continue;
      }
      later.push_back(a);
    }
    asking = std::move(later);
    const SystemState st = state_at(now_s);
    const std::int64_t n = st.active_sessions;
    // The blocks the sessions hold. Demand beyond the pool: the KV of a full-mode session cannot
    // grow, so every frame stalls.
    std::int64_t demand = 0;
    for (const Session& x : sessions) demand += BlocksAt(s, now_s - x.start_s);
    const bool overflow = s.total_blocks > 0 && demand > s.total_blocks;
    trace.num_overflow_ticks += overflow ? 1 : 0;
    const bool stepped =
        s.step_at_s >= 0.0 && now_s >= s.step_at_s && (s.step_end_s < 0.0 || now_s < s.step_end_s);
    const double factor = stepped ? s.step_factor : 1.0;
    const std::int64_t n_fit =
        s.stall_excess_only && s.projected_blocks > 0 ? s.total_blocks / s.projected_blocks : 0;
    const double spike_ms = SpikeMs(s, spike_rng);
    double wait_ms = spike_ms;  // what every frame of this tick waits for besides the plant
    if (s.work_per_session > 0.0) {
      backlog_ms = NextBacklogMs(s, now_s, n, spike_ms, backlog_ms);
      wait_ms = backlog_ms;
    }
    // Scenario::window_fills: the sessions' mean fill's share.
    const double kv_ms = s.window_fills && n > 0 ? s.kv_latency_ms * static_cast<double>(demand) /
                                                       static_cast<double>(n * s.projected_blocks)
                                                 : 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      const bool stalled = overflow && i >= n_fit;
      const double latency =
          stalled ? s.stall_latency_ms
                  : factor * (s.latency_ms(n) + kv_ms + s.jitter_ms * rng.Uniform()) + wait_ms;
      const bool missed = latency > deadline_ms;
      c.OnFrame(now_s, latency, deadline_ms, missed);
      ++trace.num_frames;
      trace.num_misses += missed ? 1 : 0;
    }
    c.OnTick(now_s, st);
    trace.limit.push_back(c.limit());
    trace.active.push_back(n);
    trace.peak_active = std::max(trace.peak_active, n);
    trace.max_limit = std::max(trace.max_limit, c.limit());
    trace.ticks_with_limit_below_active += c.limit() < n ? 1 : 0;
    for (LimitChange& ch : c.TakeLimitChanges()) trace.changes.push_back(std::move(ch));
  }
  // Conservation: nothing left the system except by ending.
  EXPECT_EQ(trace.num_admitted - trace.num_ended, static_cast<std::int64_t>(sessions.size()));
  return trace;
}

// First time the limit reaches `level` (-1: never).
double FirstReachS(const Trace& t, double level) {
  for (std::size_t i = 0; i < t.limit.size(); ++i) {
    if (static_cast<double>(t.limit[i]) >= level) return static_cast<double>(i) * t.tick_s;
  }
  return -1.0;
}

// N_true: the largest N whose p99 frame latency stays within the high target. The jitter is
// uniform, so p99 = latency(N) + 0.99 * jitter.
std::int64_t TrueCapacity(const Scenario& s, double high_target) {
  std::int64_t n = 0;
  while (s.latency_ms(n + 1) + 0.99 * s.jitter_ms <= high_target * s.period_ms) ++n;
  return n;
}

// N_true by the static criterion of experiments 04 and 08: the largest fixed population N whose
// p99 frame latency over `duration_s` (nearest rank, every frame) stays within the high target,
// the frames drawn as Simulate draws them (jitter and stalls). For plants whose p99 grows with N.
std::int64_t StaticCapacity(const Scenario& s, double high_target, double duration_s) {
  auto p99_ms = [&](std::int64_t n) {
    Rng rng(1);
    Rng spike_rng(s.spike_seed);
    std::vector<double> latencies;
    const auto num_ticks = static_cast<std::int64_t>(duration_s * 1000.0 / s.period_ms);
    double backlog_ms = 0.0;
    for (std::int64_t k = 0; k < num_ticks; ++k) {
      const double spike_ms = SpikeMs(s, spike_rng);
      backlog_ms =
          NextBacklogMs(s, static_cast<double>(k) * s.period_ms / 1000.0, n, spike_ms, backlog_ms);
      const double wait_ms = s.work_per_session > 0.0 ? backlog_ms : spike_ms;
      for (std::int64_t i = 0; i < n; ++i) {
        latencies.push_back(s.latency_ms(n) + s.jitter_ms * rng.Uniform() + wait_ms);
      }
    }
    const auto rank =
        static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(latencies.size())) - 1);
    std::nth_element(latencies.begin(), latencies.begin() + static_cast<std::ptrdiff_t>(rank),
                     latencies.end());
    return latencies[rank];
  };
  std::int64_t n = 0;
  while (p99_ms(n + 1) <= high_target * s.period_ms) ++n;
  return n;
}

struct Settling {
  double mean = 0.0;
  std::int64_t min = 0;
  std::int64_t max = 0;
  double settle_s = -1.0;  // first time after which the limit stays within +-10% of the target
};

Settling Analyze(const Trace& t, double from_s, double target) {
  const auto first = static_cast<std::size_t>(from_s / t.tick_s);
  Settling r;
  r.min = *std::min_element(t.limit.begin() + first, t.limit.end());
  r.max = *std::max_element(t.limit.begin() + first, t.limit.end());
  double sum = 0.0;
  for (std::size_t i = first; i < t.limit.size(); ++i) sum += static_cast<double>(t.limit[i]);
  r.mean = sum / static_cast<double>(t.limit.size() - first);
  for (std::size_t i = t.limit.size(); i-- > 0;) {
    if (std::abs(static_cast<double>(t.limit[i]) - target) > 0.1 * target) {
      r.settle_s = static_cast<double>(i + 1) * t.tick_s;
      break;
    }
    r.settle_s = 0.0;
  }
  return r;
}

// Latency linear in N up to a knee at 30, then growing 15% per extra session (Vector's
// "shallow-knee" shape): the dead band [0.65 D, 0.85 D] straddles the knee.
double KneeLatencyMs(std::int64_t n) {
  const double linear = 16.0 + 1.0 * static_cast<double>(n);
  return n <= 30 ? linear : linear * std::pow(1.15, static_cast<double>(n - 30));
}

void Report(const char* name, std::int64_t n_true, const Settling& st, const Trace& t) {
  std::printf(
      "[%s] N_true=%lld settled mean=%.2f min=%lld max=%lld (amplitude %.1f%% of N_true), "
      "within 10%% of N_true after %.1f s (-1: never), %zu limit changes, peak active %lld, "
      "miss ratio %.5f\n",
      name, static_cast<long long>(n_true), st.mean, static_cast<long long>(st.min),
      static_cast<long long>(st.max),
      100.0 * static_cast<double>(st.max - st.min) / static_cast<double>(n_true),
      st.settle_s >= static_cast<double>(t.limit.size()) * t.tick_s ? -1.0 : st.settle_s,
      t.changes.size(), static_cast<long long>(t.peak_active),
      static_cast<double>(t.num_misses) /
          static_cast<double>(std::max<std::int64_t>(1, t.num_frames)));
}

// Whether some limit change's reason holds `text`.
bool SomeReasonHas(const Trace& t, const char* text) {
  return std::any_of(t.changes.begin(), t.changes.end(), [text](const LimitChange& ch) {
    return ch.reason.find(text) != std::string::npos;
  });
}

TEST(AimdClosedLoopTest, ColdStartSettlesNearTrueCapacityOfAKneePlant) {
  Scenario s;
  s.latency_ms = KneeLatencyMs;
  const std::int64_t n_true = TrueCapacity(s, 0.85);
  ASSERT_EQ(n_true, 32);
  AimdController c(AimdOptions{.initial_limit = 4}, {});
  const Trace t = Simulate(s, c);
  const Settling st = Analyze(t, 300.0, static_cast<double>(n_true));
  Report("knee, cold start", n_true, st, t);
  EXPECT_NEAR(st.mean, static_cast<double>(n_true), 0.1 * static_cast<double>(n_true));
  EXPECT_LE(static_cast<double>(st.max - st.min), 0.15 * static_cast<double>(n_true));
  EXPECT_GE(st.settle_s, 0.0);
  EXPECT_LE(st.settle_s, 120.0);
  for (const LimitChange& ch : t.changes) EXPECT_FALSE(ch.reason.empty());
}

TEST(AimdClosedLoopTest, OverWarmStartIsCutThenSettlesWithoutEvicting) {
  Scenario s;
  s.latency_ms = KneeLatencyMs;
  const std::int64_t n_true = TrueCapacity(s, 0.85);
  AimdController c(AimdOptions{.initial_limit = 45}, {});
  const Trace t = Simulate(s, c);
  const Settling st = Analyze(t, 300.0, static_cast<double>(n_true));
  Report("knee, warm start 45", n_true, st, t);
  EXPECT_GT(t.peak_active, n_true);  // the warm start over-admitted first
  ASSERT_FALSE(t.changes.empty());
  EXPECT_EQ(t.changes[0].reason.rfind("cut: ", 0), 0u) << t.changes[0].reason;
  // After the cut the limit sat below the active count for a while: sessions were not evicted, they
  // drained by ending.
  EXPECT_GT(t.ticks_with_limit_below_active, 0);
  EXPECT_NEAR(st.mean, static_cast<double>(n_true), 0.1 * static_cast<double>(n_true));
  // 0.16, not 0.15, since cuts wait for confirmation (AimdController, bursts of late frames): a
  // marginal crossing at 33 shows one or two bursts, so the cut comes a window later and from that
  // window's active count, a trough of 28 where it was 29.
  EXPECT_LE(static_cast<double>(st.max - st.min), 0.16 * static_cast<double>(n_true));
}

TEST(AimdClosedLoopTest, LinearPlantSettlesInsideTheDeadBand) {
  // No knee: 1.5 ms per session. The law holds anywhere between the low-target crossing (18) and
  // the high-target crossing (N_true = 30), so it settles near the low crossing (22 here: windows
  // in which sessions ended read a little fast), well below N_true: the price of the dead band,
  // which buys a limit that does not oscillate. A knee inside the band (the tests above) removes
  // it.
  Scenario s;
  s.latency_ms = [](std::int64_t n) { return 20.0 + 1.5 * static_cast<double>(n); };
  const std::int64_t n_true = TrueCapacity(s, 0.85);
  const std::int64_t n_low = TrueCapacity(s, 0.65);
  AimdController c(AimdOptions{.initial_limit = 4}, {});
  const Trace t = Simulate(s, c);
  const Settling st = Analyze(t, 300.0, static_cast<double>(n_true));
  Report("linear", n_true, st, t);
  EXPECT_GE(st.min, n_low);
  EXPECT_LE(st.max, n_true);
  EXPECT_LE(static_cast<double>(st.max - st.min), 0.15 * static_cast<double>(n_true));
  EXPECT_EQ(t.num_misses, 0);
}

// Full-mode (unbounded) KV: latency is flat until the pool overflows, then a wall. The latency
// signal has no gradient before the wall, so AIMD alone over-admits; the KV guard does not.
Scenario CliffScenario() {
  Scenario s;
  s.latency_ms = [](std::int64_t n) { return 20.0 + 0.5 * static_cast<double>(n); };
  s.min_session_s = 60.0;  // every session runs exactly its projected length
  s.max_session_s = 60.0;
  s.duration_s = 300.0;
  s.projected_blocks = BlocksAt(s, 60.0);  // 50 blocks
  s.total_blocks = 1000;                   // N_mem = 20
  return s;
}

TEST(AimdClosedLoopTest, CliffWithoutKvGuardOverAdmits) {
  const Scenario s = CliffScenario();
  ASSERT_EQ(s.projected_blocks, 50);
  const std::int64_t n_mem = s.total_blocks / s.projected_blocks;
  AimdController c(AimdOptions{.initial_limit = 4}, {});
  const Trace t = Simulate(s, c);
  std::printf(
      "[cliff, no guard] N_mem=%lld peak active %lld, %lld overflow ticks, miss ratio %.4f\n",
      static_cast<long long>(n_mem), static_cast<long long>(t.peak_active),
      static_cast<long long>(t.num_overflow_ticks),
      static_cast<double>(t.num_misses) / static_cast<double>(t.num_frames));
  EXPECT_GT(t.peak_active, n_mem);
  EXPECT_GT(t.num_overflow_ticks, 0);
  EXPECT_GT(t.num_misses, 0);
}

// Without the guard the first over-admission cannot be prevented (the latency is flat until the
// pool overflows), but once misses have cut the limit it must not regrow into the wall at the
// headroom-scaled pace: above the last miss cut's limit growth is +1 a window.
TEST(AimdClosedLoopTest, WallWithoutKvGuardDoesNotRegrowIntoItAfterAMissCut) {
  Scenario s;
  s.latency_ms = [](std::int64_t n) { return 20.0 + 0.05 * static_cast<double>(n); };
  s.window_kv = true;
  s.stall_excess_only = true;
  s.projected_blocks = 10;
  s.total_blocks = 2000;  // N_mem = 200; the latency allows ~640
  s.arrivals_per_s = 10.0;
  s.duration_s = 600.0;
  const std::int64_t n_mem = s.total_blocks / s.projected_blocks;
  AimdController c(AimdOptions{.initial_limit = 4}, {});
  const Trace t = Simulate(s, c);
  std::size_t first_cut = t.changes.size();
  for (std::size_t i = 0; i < t.changes.size(); ++i) {
    if (t.changes[i].reason.find("miss ratio") != std::string::npos) {
      first_cut = i;
      break;
    }
  }
  ASSERT_LT(first_cut, t.changes.size());
  std::int64_t regrown = 0;  // the limit's highest value after the first miss cut
  const auto cut_tick = static_cast<std::size_t>(t.changes[first_cut].t_s / t.tick_s);
  for (std::size_t k = cut_tick; k < t.limit.size(); ++k) regrown = std::max(regrown, t.limit[k]);
  for (const LimitChange& ch : t.changes) {
    if (ch.t_s > t.changes[first_cut].t_s && ch.to > ch.from) {
      EXPECT_LE(ch.to - ch.from, 1) << ch.reason;
    }
  }
  std::printf(
      "[wall, no guard] N_mem=%lld first miss cut %lld -> %lld at %.1f s, highest limit "
      "after it %lld\n",
      static_cast<long long>(n_mem), static_cast<long long>(t.changes[first_cut].from),
      static_cast<long long>(t.changes[first_cut].to), t.changes[first_cut].t_s,
      static_cast<long long>(regrown));
  EXPECT_LE(regrown, t.changes[first_cut].from);
}

TEST(AimdClosedLoopTest, CliffWithKvGuardStaysWithinThePool) {
  const Scenario s = CliffScenario();
  const std::int64_t n_mem = s.total_blocks / s.projected_blocks;
  AimdController c(AimdOptions{.window = {.kv_guard = true}, .initial_limit = 4}, {});
  const Trace t = Simulate(s, c);
  std::printf(
      "[cliff, kv guard] N_mem=%lld peak active %lld, limit %lld, %lld kv_guard "
      "rejections, %lld misses\n",
      static_cast<long long>(n_mem), static_cast<long long>(t.peak_active),
      static_cast<long long>(c.limit()), static_cast<long long>(t.num_kv_guard_rejections),
      static_cast<long long>(t.num_misses));
  EXPECT_EQ(t.peak_active, n_mem);
  EXPECT_EQ(t.num_overflow_ticks, 0);
  EXPECT_EQ(t.num_misses, 0);
  // The guard's bound also caps the limit's growth, so the refusals say "limit".
  EXPECT_LE(t.max_limit, n_mem);
}

// Today's law, for comparison: +1 per window of window_s, no slow start.
AimdOptions OldLaw(std::int64_t initial_limit) {
  AimdOptions o;
  o.initial_limit = initial_limit;
  o.slow_start_factor = 1.0;
  o.headroom_gain = 0.0;
  o.window.window_frames = 0;
  return o;
}

TEST(AimdClosedLoopTest, FromLimitOneReachesAKneePlantFastAndSettlesWithoutMisses) {
  Scenario s;
  s.latency_ms = KneeLatencyMs;
  const std::int64_t n_true = TrueCapacity(s, 0.85);
  const double target = 0.9 * static_cast<double>(n_true);
  AimdController fast(AimdOptions{.initial_limit = 1}, {});
  const Trace t = Simulate(s, fast);
  AimdController old(OldLaw(1), {});
  const Trace t_old = Simulate(s, old);
  const Settling st = Analyze(t, 300.0, static_cast<double>(n_true));
  Report("knee, from 1", n_true, st, t);
  const double reach_s = FirstReachS(t, target);
  const double reach_old_s = FirstReachS(t_old, target);
  std::printf("[knee, from 1] 0.9 N_true first reached after %.1f s (today's law: %.1f s)\n",
              reach_s, reach_old_s);
  ASSERT_GE(reach_s, 0.0);
  EXPECT_LE(reach_s, 20.0);  // 250 periods; today's law needs ~29 windows of 2 s
  EXPECT_GT(reach_old_s, 2.0 * reach_s);
  EXPECT_GE(st.mean, 0.9 * static_cast<double>(n_true));
  EXPECT_LE(st.max, n_true);
  EXPECT_LE(static_cast<double>(st.max - st.min), 0.1 * static_cast<double>(n_true));
  EXPECT_EQ(t.num_misses, 0);
  // Slow start stops at the projected crossing: on the way up the limit passed N_true by at most
  // one session (a window that mixes the loads before and after an admission reads a little
  // fast), and that one was cut without a miss.
  EXPECT_LE(t.max_limit, n_true + 1);
}

// Sessions heavier than the reference (6.4 units each) from a budget of 1 unit: the first is
// admitted alone and the budget follows its price (without that, nobody is ever admitted and no
// window moves the budget), then slow start grows the budget in units as for light sessions.
TEST(AimdClosedLoopTest, HeavySessionsFromABudgetOfOneUnitReachTheKnee) {
  Scenario s;
  s.latency_ms = KneeLatencyMs;
  s.session_work = 6.4;
  const std::int64_t n_true = TrueCapacity(s, 0.85);
  AimdController c(AimdOptions{.initial_limit = 1}, {});
  const Trace t = Simulate(s, c);
  ASSERT_FALSE(t.changes.empty());
  EXPECT_NE(t.changes[0].reason.find("lone session's price"), std::string::npos)
      << t.changes[0].reason;
  // The sessions a budget admits: floor(limit / price).
  const auto sessions_at = [&](std::int64_t limit) {
    return static_cast<std::int64_t>(std::floor(static_cast<double>(limit) / s.session_work));
  };
  std::int64_t reached_at_tick = -1;
  double mean_sessions = 0.0;
  const std::size_t from = t.limit.size() / 2;
  for (std::size_t i = 0; i < t.limit.size(); ++i) {
    const std::int64_t n = sessions_at(t.limit[i]);
    if (reached_at_tick < 0 && static_cast<double>(n) >= 0.9 * static_cast<double>(n_true)) {
      reached_at_tick = static_cast<std::int64_t>(i);
    }
    if (i >= from) mean_sessions += static_cast<double>(n);
  }
  mean_sessions /= static_cast<double>(t.limit.size() - from);
  std::printf(
      "[heavy, from 1 unit] N_true=%lld sessions, 0.9 N_true reached after %.1f s, "
      "second-half mean %.2f sessions, peak active %lld, %lld misses\n",
      static_cast<long long>(n_true), static_cast<double>(reached_at_tick) * t.tick_s,
      mean_sessions, static_cast<long long>(t.peak_active), static_cast<long long>(t.num_misses));
  ASSERT_GE(reached_at_tick, 0);
  EXPECT_LE(static_cast<double>(reached_at_tick) * t.tick_s, 20.0);
  EXPECT_GE(mean_sessions, 0.9 * static_cast<double>(n_true));
  EXPECT_LE(t.peak_active, n_true + 1);
  EXPECT_EQ(t.num_misses, 0);
}

// A 2 s period (qwen25-omni-7b's audio blocks): windows close on frames, so the limit moves every
// few seconds once there are sessions, not once per 25 periods.
TEST(AimdClosedLoopTest, LongPeriodFromLimitOneReachesTheKneeWithin150Periods) {
  Scenario s;
  s.period_ms = 2000.0;
  s.latency_ms = [](std::int64_t n) { return 25.0 * KneeLatencyMs(n); };
  s.jitter_ms = 50.0;
  s.arrivals_per_s = 2.0;
  s.min_session_s = 300.0;
  s.max_session_s = 900.0;
  s.duration_s = 1200.0;
  const std::int64_t n_true = TrueCapacity(s, 0.85);
  const double target = 0.9 * static_cast<double>(n_true);
  // The CLI's windows for a 2 s period: at most 25 periods, at least 2.
  AimdOptions o{.window = {.window_s = 50.0, .min_window_s = 4.0}, .initial_limit = 1};
  AimdController fast(o, {});
  const Trace t = Simulate(s, fast);
  AimdOptions old_o = OldLaw(1);
  old_o.window.window_s = 50.0;
  AimdController old(old_o, {});
  const Trace t_old = Simulate(s, old);
  const Settling st = Analyze(t, 600.0, static_cast<double>(n_true));
  Report("2 s period, from 1", n_true, st, t);
  const double reach_s = FirstReachS(t, target);
  std::printf("[2 s period, from 1] 0.9 N_true first reached after %.0f s (today's law: %.0f s)\n",
              reach_s, FirstReachS(t_old, target));
  ASSERT_GE(reach_s, 0.0);
  EXPECT_LE(reach_s, 300.0);
  EXPECT_GE(st.mean, 0.9 * static_cast<double>(n_true));
  EXPECT_LE(st.max, n_true);
  EXPECT_EQ(t.num_misses, 0);
  const double reach_old_s = FirstReachS(t_old, target);  // +1 per 50 s: ~29 windows
  EXPECT_TRUE(reach_old_s < 0.0 || reach_old_s > 300.0) << reach_old_s;
}

// Continuous batching near saturation (qwen25-omni-7b W=1024's shape): latency = floor / (1 - N /
// N_sat), flat for most of the way and then steep, with N_true in the hundreds and a large max
// limit. Proportional extrapolation from half of N_sat (0.41 D) projects the low-target crossing
// at 1.06 N_true and slow start doubles into it; the hyperbolic projection stops short.
TEST(AimdClosedLoopTest, HyperbolicPlantWithALargeMaxLimitDoesNotOvershoot) {
  Scenario s;
  s.latency_ms = [](std::int64_t n) { return 3.0 / (1.0 - static_cast<double>(n) / 1000.0); };
  // The floor, 3 ms = 0.0375 D, is a sliver of the deadline. No additive jitter: a queue amplifies
  // all of its latency (an unamplified additive term would read as a higher floor).
  s.jitter_ms = 0.0;
  s.arrivals_per_s = 48.0;  // 2 N_true within the first 40 s
  s.min_session_s = 900.0;  // nobody leaves during the run: the crowd of experiment 08
  s.max_session_s = 900.0;
  s.duration_s = 300.0;
  const std::int64_t n_true = TrueCapacity(s, 0.85);
  ASSERT_EQ(n_true, 955);
  AimdController c(AimdOptions{.window = {.max_limit = 4096}, .initial_limit = 1}, {});
  const Trace t = Simulate(s, c);
  const Settling st = Analyze(t, 200.0, static_cast<double>(n_true));
  Report("hyperbolic, from 1, max 4096", n_true, st, t);
  const double reach_s = FirstReachS(t, 0.9 * static_cast<double>(n_true));
  std::printf("[hyperbolic] 0.9 N_true first reached after %.1f s, max limit %lld\n", reach_s,
              static_cast<long long>(t.max_limit));
  EXPECT_LE(t.max_limit, n_true);
  EXPECT_EQ(t.num_misses, 0);
  ASSERT_GE(reach_s, 0.0);
  EXPECT_LE(reach_s, 60.0);
  EXPECT_GE(st.mean, 0.9 * static_cast<double>(n_true));
  EXPECT_LE(static_cast<double>(st.max - st.min), 0.1 * static_cast<double>(n_true));
}

// The CPU engine on a shared machine: frames of ~0.2 D, and now and then the engine stalls for
// 1-1.6 D (another process on the cores), whatever the load. Stalls hit 0.5% of the ticks, so
// they stay under the 1% that a p99 ignores and N_true (the static criterion, measured here) is
// the knee's; but every stall makes every frame of its tick late at once, and a control window
// of a few dozen ticks that holds one reads a p99 past the deadline and a miss ratio of a few
// percent. A controller that cuts on one such window cuts again and again far below N_true.
Scenario StalledKneeScenario() {
  Scenario s;
  s.latency_ms = KneeLatencyMs;
  s.spike_per_tick = 0.005;
  s.spike_min_ms = 1.0 * kPeriodMs;
  s.spike_max_ms = 1.6 * kPeriodMs;
  // Seeds 1-13 in the test below: 10 settle at 31; 7, 11 and 12 cut once on a cluster of three
  // stalls within 2-3 s (which the crowd then never drains).
  s.spike_seed = 1;
  return s;
}

TEST(AimdClosedLoopTest, RareLoadIndependentStallsDoNotHoldTheLimitBelowNTrue) {
  Scenario s = StalledKneeScenario();
  s.arrivals_per_s = 6.0;
  s.min_session_s = 900.0;  // the crowd of experiment 08: nobody leaves during the run
  s.max_session_s = 900.0;
  const std::int64_t n_true = StaticCapacity(s, 0.85, 600.0);
  Scenario calm = s;
  calm.spike_per_tick = 0.0;
  ASSERT_EQ(n_true, StaticCapacity(calm, 0.85, 600.0));  // the stalls do not move N_true
  AimdController c(AimdOptions{.initial_limit = 1}, {});
  const Trace t = Simulate(s, c);
  const Settling st = Analyze(t, 400.0, static_cast<double>(n_true));
  Report("knee + stalls, from 1", n_true, st, t);
  std::int64_t num_cuts = 0;
  for (const LimitChange& ch : t.changes) num_cuts += ch.to < ch.from ? 1 : 0;
  std::printf("[knee + stalls, from 1] 0.9 N_true first reached after %.1f s, %lld cuts\n",
              FirstReachS(t, 0.9 * static_cast<double>(n_true)), static_cast<long long>(num_cuts));
  EXPECT_GE(st.mean, 0.9 * static_cast<double>(n_true));
  EXPECT_LE(st.max, n_true);
  EXPECT_LE(static_cast<double>(st.max - st.min), 0.1 * static_cast<double>(n_true));
  const double reach_s = FirstReachS(t, 0.9 * static_cast<double>(n_true));
  ASSERT_GE(reach_s, 0.0);
  EXPECT_LE(reach_s, 60.0);
}

// A continuously batching engine near saturation: latency flat in the calm ticks at any load,
// stalls of 4-16 ms every 2 s on average amplified into episodes by a queue that drains at 1 - u
// a tick (u = N / 80), and a crowd that never leaves. N_true (p99 over 300 s <= 0.85 D) is set by
// the episodes, at u ~ 0.97, not by the calm latency, which stays under 0.5 D up to saturation:
// past N = 80 the queue never drains.
Scenario EpisodicQueueScenario() {
  Scenario s;
  s.period_ms = 40.0;
  s.latency_ms = [](std::int64_t n) { return 8.0 + 0.1 * static_cast<double>(n); };
  s.work_per_session = 1.0 / 80.0;
  s.spike_per_tick = 0.02;
  s.spike_min_ms = 4.0;
  s.spike_max_ms = 16.0;
  s.arrivals_per_s = 10.0;
  s.min_session_s = 900.0;
  s.max_session_s = 900.0;
  s.duration_s = 300.0;
  return s;
}

TEST(AimdClosedLoopTest, WorkUtilizationCapsGrowthBeforeEpisodesTakeOver) {
  const Scenario s = EpisodicQueueScenario();
  const std::int64_t n_true = StaticCapacity(s, 0.85, 300.0);
  ASSERT_GT(n_true, 40);
  ASSERT_LT(n_true, 80);
  // Without the cap the calm windows between episodes read as room to grow: the crowd is
  // admitted past N_true for good (nobody leaves, and a cut sheds no one).
  AimdController uncapped(AimdOptions{.max_utilization = 1.0, .initial_limit = 1}, {});
  const Trace tu = Simulate(s, uncapped);
  Report("episodes, no utilization cap", n_true, Analyze(tu, 200.0, static_cast<double>(n_true)),
         tu);
  EXPECT_GT(tu.peak_active, n_true);
  // With the default cap (0.9) growth stops short of saturation: settled at 72 = 0.9 x 80, in
  // [0.9, 1.0] N_true here, fast, without a miss.
  AimdController capped(AimdOptions{.initial_limit = 1}, {});
  const Trace tc = Simulate(s, capped);
  const Settling st = Analyze(tc, 200.0, static_cast<double>(n_true));
  Report("episodes, utilization cap", n_true, st, tc);
  const double reach_s = FirstReachS(tc, 0.9 * static_cast<double>(n_true));
  std::printf("[episodes, utilization cap] 0.9 N_true first reached after %.1f s\n", reach_s);
  EXPECT_LE(tc.peak_active, n_true);
  EXPECT_GE(st.mean, 0.9 * static_cast<double>(n_true));
  EXPECT_LE(static_cast<double>(st.max - st.min), 0.1 * static_cast<double>(n_true));
  ASSERT_GE(reach_s, 0.0);
  EXPECT_LE(reach_s, 60.0);
  EXPECT_TRUE(SomeReasonHas(tc, "work utilization"));
}

// The episodic engine on a machine that is 30% slower for 5 s out of every 40 (from 10 s on):
// sessions admitted at the fast speed stay through the slow phases, whose backlog (u = 1.3 N / 80)
// sets N_true (61). Read at the current speed the cap admits 72 between the phases (33% of frames
// late); read at the slowest speed of the last minutes it stops near 0.9 x 80 / 1.3 = 55 once a
// slow phase has been seen (the first comes during slow start; 58 here: the 2 s fit reads most of
// a 5 s phase, not all of it).
TEST(AimdClosedLoopTest, UtilizationCapHoldsAtTheSlowestRecentSpeed) {
  Scenario s = EpisodicQueueScenario();
  s.slow_factor = 1.3;
  s.slow_first_s = 10.0;
  s.slow_every_s = 40.0;
  s.slow_for_s = 5.0;
  const std::int64_t n_true = StaticCapacity(s, 0.85, 300.0);
  ASSERT_GT(n_true, 40);
  ASSERT_LT(n_true, 72);
  AimdController c(AimdOptions{.initial_limit = 1}, {});
  const Trace t = Simulate(s, c);
  const auto target = static_cast<double>(n_true);
  Report("speed phases, utilization cap", n_true, Analyze(t, 200.0, target), t);
  EXPECT_LE(t.peak_active, n_true);
  EXPECT_GE(Analyze(t, 200.0, target).mean, 0.9 * target);
  EXPECT_GE(FirstReachS(t, 0.9 * target), 0.0);
  EXPECT_LE(FirstReachS(t, 0.9 * target), 60.0);
  EXPECT_TRUE(SomeReasonHas(t, "at the slowest recent speed"));
}

TEST(AimdClosedLoopTest, NoGrowthWhileTheLimitDoesNotBind) {
  // Few arrivals: about 0.2/s x 40 s = 8 sessions against a capacity of 32.
  Scenario s;
  s.latency_ms = KneeLatencyMs;
  s.arrivals_per_s = 0.2;
  AimdController c(AimdOptions{.initial_limit = 1}, {});
  const Trace t = Simulate(s, c);
  std::printf("[not binding] peak active %lld, max limit %lld\n",
              static_cast<long long>(t.peak_active), static_cast<long long>(t.max_limit));
  // Growth needs a binding window (peak active >= limit - 1): one slow-start doubling past the
  // peak at most, nowhere near the plant's capacity.
  EXPECT_LE(t.max_limit, 2 * (t.peak_active + 1));
  EXPECT_LT(t.max_limit, TrueCapacity(s, 0.85));
  for (const LimitChange& ch : t.changes) {
    EXPECT_EQ(ch.reason.find("cut"), std::string::npos) << ch.reason;
  }
}

TEST(AimdClosedLoopTest, LatencyStepCutsTheLimitBelowTheNewCapacity) {
  // At 300 s every frame becomes 40% slower (a co-tenant, thermal throttling): N_true drops.
  Scenario s;
  s.latency_ms = KneeLatencyMs;
  s.step_at_s = 300.0;
  s.step_factor = 1.4;
  Scenario after = s;
  after.latency_ms = [](std::int64_t n) { return 1.4 * KneeLatencyMs(n); };
  after.jitter_ms = 1.4 * s.jitter_ms;
  const std::int64_t n_true_before = TrueCapacity(s, 0.85);
  const std::int64_t n_true_after = TrueCapacity(after, 0.85);
  ASSERT_LT(n_true_after, n_true_before);
  AimdController c(AimdOptions{.initial_limit = 1}, {});
  const Trace t = Simulate(s, c);
  const Settling st = Analyze(t, 450.0, static_cast<double>(n_true_after));
  Report("latency step", n_true_after, st, t);
  bool cut_after_step = false;
  for (const LimitChange& ch : t.changes) {
    if (ch.t_s >= 300.0 && ch.reason.rfind("cut: ", 0) == 0) cut_after_step = true;
  }
  EXPECT_TRUE(cut_after_step);
  EXPECT_LE(st.max, n_true_after);
  EXPECT_GE(st.mean, 0.8 * static_cast<double>(n_true_after));
}

// The stall rate the controller learns must not hide a rise that tracks the load: the knee plant
// with the stalls above, and at 300 s every frame 40% slower. The crossing fills most slots of
// the window with late frames, far above one stall per 100 slots: the cut comes within seconds.
TEST(AimdClosedLoopTest, LearnedStallRateDoesNotHideALatencyStep) {
  Scenario s = StalledKneeScenario();
  s.step_at_s = 300.0;
  s.step_factor = 1.4;
  Scenario after = s;
  after.latency_ms = [](std::int64_t n) { return 1.4 * KneeLatencyMs(n); };
  after.jitter_ms = 1.4 * s.jitter_ms;
  after.step_at_s = -1.0;
  const std::int64_t n_true_after = StaticCapacity(after, 0.85, 300.0);
  ASSERT_LT(n_true_after, StaticCapacity(s, 0.85, 300.0));
  AimdController c(AimdOptions{.initial_limit = 1}, {});
  const Trace t = Simulate(s, c);
  const Settling st = Analyze(t, 450.0, static_cast<double>(n_true_after));
  Report("stalls + latency step", n_true_after, st, t);
  double first_cut_after_step_s = -1.0;
  for (const LimitChange& ch : t.changes) {
    if (ch.t_s >= 300.0 && ch.to < ch.from) {
      first_cut_after_step_s = ch.t_s;
      break;
    }
  }
  ASSERT_GE(first_cut_after_step_s, 300.0);
  EXPECT_LE(first_cut_after_step_s, 305.0);
  EXPECT_LE(st.max, n_true_after);
  EXPECT_GE(st.mean, 0.8 * static_cast<double>(n_true_after));
}

// A slow-down that passes (a co-tenant for a minute) while nobody leaves: the cut is right, but
// the drain the cooldown waits for never comes, since the sessions admitted before it stay. Once a
// window carrying that load reads under the low target again, the hold ends and the limit climbs
// back to the plant's N_true (on main before this rule it stayed at the cut for good).
TEST(AimdClosedLoopTest, TransientSlowdownWithoutDeparturesCutsThenRegrowsToNTrue) {
  Scenario s;
  s.latency_ms = KneeLatencyMs;
  s.min_session_s = 900.0;  // nobody leaves during the run
  s.max_session_s = 900.0;
  s.step_at_s = 200.0;
  s.step_end_s = 260.0;
  s.step_factor = 1.4;
  Scenario calm = s;
  calm.step_at_s = -1.0;
  const std::int64_t n_true = TrueCapacity(calm, 0.85);
  AimdController c(AimdOptions{.initial_limit = 1}, {});
  const Trace t = Simulate(s, c);
  const Settling st = Analyze(t, 400.0, static_cast<double>(n_true));
  Report("transient slow-down, no departures", n_true, st, t);
  std::int64_t cut_to = -1;
  bool grew_after_cut = false;
  for (const LimitChange& ch : t.changes) {
    std::printf("  t=%.1f %lld -> %lld: %s\n", ch.t_s, static_cast<long long>(ch.from),
                static_cast<long long>(ch.to), ch.reason.c_str());
    if (ch.t_s >= 200.0 && ch.to < ch.from && cut_to < 0) cut_to = ch.to;
    if (cut_to >= 0 && ch.to > ch.from) grew_after_cut = true;
  }
  ASSERT_GE(cut_to, 0) << "the slow-down must cut";
  EXPECT_LT(cut_to, n_true);
  EXPECT_TRUE(grew_after_cut);
  EXPECT_GT(st.min, cut_to);
  EXPECT_GE(st.mean, 0.9 * static_cast<double>(n_true));
  EXPECT_LE(st.max, n_true);
}

TEST(AimdClosedLoopTest, KvGuardCapsSlowStartAtThePoolsBound) {
  // Window KV: each session holds its 50-block bound; the pool fits 20, the plant 32.
  Scenario s;
  s.latency_ms = KneeLatencyMs;
  s.window_kv = true;
  s.projected_blocks = 50;
  s.total_blocks = 1000;
  const std::int64_t n_mem = s.total_blocks / s.projected_blocks;
  ASSERT_LT(n_mem, TrueCapacity(s, 0.85));
  AimdController c(AimdOptions{.window = {.kv_guard = true}, .initial_limit = 1}, {});
  const Trace t = Simulate(s, c);
  std::printf("[window KV, guard] N_mem=%lld max limit %lld peak active %lld\n",
              static_cast<long long>(n_mem), static_cast<long long>(t.max_limit),
              static_cast<long long>(t.peak_active));
  EXPECT_LE(t.max_limit, n_mem);
  EXPECT_EQ(t.peak_active, n_mem);
  EXPECT_EQ(t.num_overflow_ticks, 0);
  EXPECT_EQ(t.num_misses, 0);
  EXPECT_EQ(c.limit(), n_mem);
}

// A 1 s-period model whose pool binds (qwen3-omni-30b-a3b's shape in experiment 08): frames cost
// 3-8% of the deadline, windows of 64 blocks take 500 s to fill, and the frames grow dearer with
// the batch and as the windows fill. The pool holds 80 sessions, well under the deadline's
// capacity. The queue model read the windows' filling as queueing when its floor came from a lone
// session's empty window (0.035 D at 9% filled against 0.050 D at 12%: "busy 0.3", projected to
// full KV once more) and held slow start to its projection, a session or two a window: 0.9 of the
// pool's bound after 201 s of this 1 s period, against 150 periods (issue 13); 43 s since the
// floor is compared at full KV.
TEST(AimdClosedLoopTest, FillingWindowsAreNotReadAsQueueing) {
  Scenario s;
  s.period_ms = 1000.0;
  // A step's cost grows with the batch up to 8 sessions (the simulator's qwen3-omni-30b-a3b: 0.030
  // D at 1 session, 0.039 D at 8, 0.046 D at 45).
  s.latency_ms = [](std::int64_t n) {
    return 28.0 + 2.0 * static_cast<double>(std::min<std::int64_t>(n, 8));
  };
  s.jitter_ms = 1.0;
  s.window_kv = true;
  s.window_fills = true;
  s.kv_latency_ms = 40.0;
  s.projected_blocks = 64;
  s.block_tokens = 16.0;
  s.prompt_tokens = 16.0;
  s.tokens_per_s = 64.0 * 16.0 / 500.0;
  s.total_blocks = 80 * 64;
  s.arrivals_per_s = 120.0;  // a crowd that never leaves: 2 N_mem within the first second
  s.min_session_s = 900.0;
  s.max_session_s = 900.0;
  s.duration_s = 400.0;
  const std::int64_t n_mem = s.total_blocks / s.projected_blocks;
  AimdController c(AimdOptions{.window = {.window_s = 25.0, .min_window_s = 2.0, .kv_guard = true},
                               .initial_limit = 1},
                   {});
  const Trace t = Simulate(s, c);
  const double reach_s = FirstReachS(t, 0.9 * static_cast<double>(n_mem));
  std::printf("[filling windows] 0.9 N_mem first reached after %.0f s, max limit %lld\n", reach_s,
              static_cast<long long>(t.max_limit));
  ASSERT_GE(reach_s, 0.0);
  EXPECT_LE(reach_s, 150.0);
  EXPECT_LE(t.max_limit, n_mem);
  EXPECT_EQ(t.num_overflow_ticks, 0);
  EXPECT_EQ(t.num_misses, 0);
}

TEST(AimdClosedLoopTest, PredictedLimitSeedsTheFirstDecisionCappedByThePool) {
  Scenario s;
  s.latency_ms = KneeLatencyMs;
  s.window_kv = true;
  s.projected_blocks = 50;
  s.total_blocks = 1000;
  s.duration_s = 10.0;
  AimdController c(
      AimdOptions{.window = {.kv_guard = true}, .initial_limit = 1, .predicted_limit = 30}, {});
  const Trace t = Simulate(s, c);
  ASSERT_FALSE(t.changes.empty());
  EXPECT_EQ(t.changes[0].from, 1);
  EXPECT_EQ(t.changes[0].to, 20);
  EXPECT_EQ(t.changes[0].reason,
            "seed: the cost model's predicted N* 30, capped by the pool's bound 20 for the "
            "session's window");
}

// Retry hints. Arrivals a little above what the plant serves; refused clients retry for 10 s.
Scenario RetryScenario(Retry retry) {
  Scenario s;
  s.latency_ms = KneeLatencyMs;
  s.arrivals_per_s = 1.0;  // x 30 s = 30 offered against ~31
  s.min_session_s = 20.0;
  s.max_session_s = 40.0;
  s.retry = retry;
  return s;
}

TEST(RetryHintClosedLoopTest, FixedHintStormsAndTheControllersHintDoesNot) {
  const std::int64_t n_true = TrueCapacity(RetryScenario(Retry::kNone), 0.85);
  AimdController fixed_c(AimdOptions{.initial_limit = n_true}, {});
  const Trace fixed = Simulate(RetryScenario(Retry::kFixedPeriod), fixed_c);
  AimdController hinted_c(AimdOptions{.initial_limit = n_true}, {});
  const Trace hinted = Simulate(RetryScenario(Retry::kBackoff), hinted_c);
  auto per_arrival = [](const Trace& t) {
    return static_cast<double>(t.num_rejections) / static_cast<double>(t.num_arrivals);
  };
  std::printf(
      "[retry] fixed one-period hint: %.2f rejections per arrival, %lld admitted, %lld abandoned; "
      "controller hint + backoff: %.2f per arrival, %lld admitted, %lld abandoned\n",
      per_arrival(fixed), static_cast<long long>(fixed.num_admitted),
      static_cast<long long>(fixed.num_abandoned), per_arrival(hinted),
      static_cast<long long>(hinted.num_admitted), static_cast<long long>(hinted.num_abandoned));
  EXPECT_GT(per_arrival(fixed), 5.0);
  EXPECT_LE(per_arrival(hinted), 3.0);
  EXPECT_GE(static_cast<double>(hinted.num_admitted),
            0.95 * static_cast<double>(fixed.num_admitted));
}

TEST(RetryHintTest, HintIsTheExpectedGapBetweenEndsJitteredAndReproducible) {
  RetryHint a;
  RetryHint b;
  // 10 sessions; one ends every 2 s for 20 s.
  for (RetryHint* h : {&a, &b}) {
    h->Observe(0.0, 10);
    for (int i = 1; i <= 10; ++i) h->Observe(2.0 * i, 10 - i);
  }
  EXPECT_NEAR(a.ExpectedEndGapS(20.0), 2.0, 0.1);
  const double ms = a.Ms(20.0, 80.0, std::numeric_limits<double>::infinity());
  EXPECT_GE(ms, 2000.0);
  EXPECT_LT(ms, 2000.0 * (1.0 + RetryHint::kJitterFraction));
  EXPECT_DOUBLE_EQ(ms, b.Ms(20.0, 80.0, std::numeric_limits<double>::infinity()));
  // A decision due sooner than the next end comes first.
  EXPECT_LT(a.Ms(20.0, 80.0, 0.5), 500.0 * (1.0 + RetryHint::kJitterFraction));
  // Admissions are not ends.
  RetryHint c;
  c.Observe(0.0, 0);
  for (int i = 0; i < 5; ++i) {
    c.OnAdmit();
    c.Observe(1.0 + i, i + 1);
  }
  EXPECT_TRUE(std::isinf(c.ExpectedEndGapS(10.0)));
}

TEST(RetryHintTest, BackoffDoublesFromTheHintUpToTheCap) {
  EXPECT_DOUBLE_EQ(RetryBackoffMs(100.0, 1, 1000.0), 100.0);
  EXPECT_DOUBLE_EQ(RetryBackoffMs(100.0, 2, 1000.0), 200.0);
  EXPECT_DOUBLE_EQ(RetryBackoffMs(100.0, 4, 1000.0), 800.0);
  EXPECT_DOUBLE_EQ(RetryBackoffMs(100.0, 5, 1000.0), 1000.0);
  EXPECT_DOUBLE_EQ(RetryBackoffMs(100.0, 1000, 1000.0), 1000.0);
  EXPECT_DOUBLE_EQ(RetryBackoffMs(3000.0, 3, 1000.0), 3000.0);  // never below the hint
}

}  // namespace
}  // namespace metronome::admission
