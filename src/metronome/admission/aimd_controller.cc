#include "metronome/admission/aimd_controller.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "metronome/base/check.h"

namespace metronome::admission {
namespace {

// Nearest-rank percentile: the ceil(p/100 * n)-th smallest sample. Reorders `v`.
double Percentile(std::vector<double>& v, double p) {
  const auto n = static_cast<std::int64_t>(v.size());
  auto rank = static_cast<std::int64_t>(std::ceil(p * static_cast<double>(n) / 100.0)) - 1;
  rank = std::clamp<std::int64_t>(rank, 0, n - 1);
  std::nth_element(v.begin(), v.begin() + rank, v.end());
  return v[static_cast<std::size_t>(rank)];
}

// P(X >= k) for X ~ Poisson(mean), k >= 0.
double PoissonTail(double mean, std::int64_t k) {
  double term = std::exp(-mean);  // P(X = 0)
  double below = 0.0;
  for (std::int64_t i = 0; i < k; ++i) {
    below += term;
    term *= mean / static_cast<double>(i + 1);
  }
  return std::max(0.0, 1.0 - below);
}

}  // namespace

AimdController::AimdController(const AimdOptions& options, const MemoryOptions& memory)
    : WindowedController(options.window, memory, options.initial_limit),
      options_(options),
      phase_(options.slow_start_factor > 1.0 ? Phase::kSlowStart : Phase::kGrowing) {
  const WindowOptions& w = options.window;
  MTR_CHECK(w.min_limit >= 0 && w.min_limit <= options.initial_limit &&
                options.initial_limit <= w.max_limit && options.max_samples >= 1 &&
                w.window_s > 0 && options.beta > 0 && options.beta < 1,
            "AimdOptions must pass Validate");
  samples_.reserve(static_cast<std::size_t>(options.max_samples));
  sample_sessions_.reserve(static_cast<std::size_t>(options.max_samples));
  if (options.self_late_work_fraction > 0.0) {
    late_frames_.reserve(static_cast<std::size_t>(options.max_samples));
  }
}

void AimdController::OnFrame(const FrameSample& frame) noexcept {
  MTR_DCHECK(frame.deadline_ms > 0, "deadline_ms must be > 0");
  const double now_s = frame.now_s;
  window_.OnFrame(now_s);
  const double sample = frame.latency_ms / frame.deadline_ms;
  const bool late = frame.missed || sample > options_.high_target;
  if (frame.missed) ++num_misses_;
  if (sample >= options_.low_target) ++num_over_low_;
  deadline_s_ = frame.deadline_ms / 1000.0;
  if (late) {
    if (num_over_bursts_ == 0 || now_s - burst_start_s_ > kBurstDeadlines * deadline_s_) {
      ++num_over_bursts_;
      burst_start_s_ = now_s;
    }
  }
  if (options_.self_late_work_fraction > 0.0) {
    if (late) {
      if (std::cmp_less(late_frames_.size(), options_.max_samples)) {
        late_frames_.push_back({now_s, frame.session, deadline_s_});  // reserved: no allocation
      } else {
        late_frames_overflow_ = true;
      }
    }
    if (frame.session != 0) {
      SessionWindow& sw = sessions_[frame.session];  // allocates once per session
      ++sw.frames;
      sw.late += late ? 1 : 0;
      sw.misses += frame.missed ? 1 : 0;
      sw.over_low += sample >= options_.low_target ? 1 : 0;
      sw.work = frame.work;
    }
  }
  if (std::cmp_less(samples_.size(), options_.max_samples)) {
    samples_.push_back(sample);  // within the reserved capacity: no allocation
    sample_sessions_.push_back(frame.session);
    return;
  }
  // Reservoir sampling (Algorithm R): every frame of the window is kept with equal probability.
  const std::uint64_t j = NextRandom(rng_state_) % static_cast<std::uint64_t>(window_.num_frames());
  if (j < samples_.size()) {
    samples_[j] = sample;
    sample_sessions_[j] = frame.session;
  }
}

void AimdController::LeaveOutSelfLate(AimdWindow& w, std::int64_t& over_low) {
  // The candidates: sessions with late frames, worst share of late frames first.
  std::vector<std::pair<std::uint64_t, const SessionWindow*>> late;
  double work = 0.0;  // of the sessions that sent frames
  for (const auto& [id, sw] : sessions_) {
    if (sw.frames == 0) continue;
    work += sw.work;
    if (sw.late > 0) late.emplace_back(id, &sw);
  }
  std::sort(late.begin(), late.end(), [](const auto& a, const auto& b) {
    const double fa = static_cast<double>(a.second->late) / static_cast<double>(a.second->frames);
    const double fb = static_cast<double>(b.second->late) / static_cast<double>(b.second->frames);
    return fa != fb ? fa > fb : a.first < b.first;
  });
  std::vector<std::uint64_t> out;
  double out_work = 0.0;
  for (const auto& [id, sw] : late) {
    // The worst always (a session late by itself cannot move the budget, whatever its share),
    // then more while within the fraction.
    if (!out.empty() && out_work + sw->work > options_.self_late_work_fraction * work) break;
    out.push_back(id);
    out_work += sw->work;
    w.self_late_frames += sw->frames;
    w.num_misses -= sw->misses;
    over_low -= sw->over_low;
  }
  for (auto& [id, sw] : sessions_) sw = SessionWindow{.work = sw.work};
  if (out.empty()) return;
  const auto left_out = [&out](std::uint64_t id) {
    return id != 0 && std::find(out.begin(), out.end(), id) != out.end();
  };
  w.self_late_sessions = static_cast<std::int64_t>(out.size());
  w.self_late_work = out_work;
  w.num_frames -= w.self_late_frames;
  // The kept samples, in place.
  std::size_t kept = 0;
  for (std::size_t i = 0; i < samples_.size(); ++i) {
    if (left_out(sample_sessions_[i])) continue;
    samples_[kept] = samples_[i];
    sample_sessions_[kept] = sample_sessions_[i];
    ++kept;
  }
  samples_.resize(kept);
  sample_sessions_.resize(kept);
  if (late_frames_overflow_) return;  // the bursts count every session's late frames
  std::int64_t bursts = 0;
  double start_s = 0.0;
  for (const LateFrame& f : late_frames_) {
    if (left_out(f.session)) continue;
    if (bursts == 0 || f.t_s - start_s > kBurstDeadlines * f.deadline_s) {
      ++bursts;
      start_s = f.t_s;
    }
  }
  w.num_over_bursts = bursts;
}

void AimdController::OnDecide(const SessionRequest& request, const SystemState& state,
                              std::int64_t fit, double now_s) {
  // The pool's bound for this session's window: caps growth, ends slow start, seeds the limit. In
  // the limit's unit, work: the admitted work plus the sessions like this one the pool still
  // holds (fit counts sessions; for sessions of one unit it is the same number).
  if (options_.window.kv_guard && fit != std::numeric_limits<std::int64_t>::max()) {
    const double room = static_cast<double>(std::max<std::int64_t>(0, fit - state.active_sessions));
    pool_bound_ = WholeUnits(state.Work() + room * request.work);
  }
  // How full the admitted sessions' promised KV is: windows that are still filling make every
  // frame cheaper than it will be once they are full.
  if (state.total_blocks > 0) {
    const std::int64_t used = state.total_blocks - state.free_blocks;
    if (used + state.reserved_blocks > 0) {
      kv_fill_ =
          std::clamp(static_cast<double>(used) / static_cast<double>(used + state.reserved_blocks),
                     kMinKvFill, 1.0);
    }
  }
  if (!seeded_) Seed(now_s);
}

void AimdController::Seed(double now_s) {
  seeded_ = true;
  std::int64_t to = limit();
  std::string why;
  if (options_.predicted_limit > 0) {
    to = options_.predicted_limit;
    why = Format("seed: the cost model's predicted N* %lld",
                 static_cast<long long>(options_.predicted_limit));
    // The prediction is where the low target is expected: no doubling from it, and past it only
    // paced steps (below): one early window in a fast phase of a shared machine, with windows still
    // filling, reads far under the target, and doubling from the seed on it admits well past the
    // real limit, whose sessions then stay (tests/admission/aimd_closed_loop_test.cc,
    // PredictedLimitSeedsTheFirstDecisionCappedByThePool).
    EndSlowStart();
    last_increase_s_ = now_s;
  } else {
    why = Format("seed: initial limit %lld (no calibrated cost model)",
                 static_cast<long long>(limit()));
  }
  if (pool_bound_ >= 0 && to > pool_bound_) {
    to = pool_bound_;
    why += Format(", capped by the pool's bound %lld for the session's window",
                  static_cast<long long>(pool_bound_));
  } else if (pool_bound_ >= 0) {
    why += Format(" (pool bound %lld)", static_cast<long long>(pool_bound_));
  }
  to = std::clamp(to, options_.window.min_limit, options_.window.max_limit);
  if (to != limit()) SetLimit(now_s, to, std::move(why));
  if (pool_bound_ >= 0 && limit() >= pool_bound_) EndSlowStart();
}

std::int64_t AimdController::FramesNeeded() const {
  // Far below the target (slow start) a few frames say as much as many: min_samples suffice, so
  // a lone session of a 2 s period does not wait window_frames periods for its first doubling.
  const WindowOptions& w = options_.window;
  return phase_ == Phase::kSlowStart ? std::min(w.window_frames, w.min_samples) : w.window_frames;
}

double AimdController::DecisionInS(double now_s) const {
  return raised_ ? window_.NextCloseS(now_s, FramesNeeded()) - now_s
                 : std::numeric_limits<double>::infinity();
}

void AimdController::Evaluate(const ClosedWindow& closed, double now_s, std::int64_t active) {
  const Reading r = CloseWindow(closed, now_s, active);
  Apply(DecideWindow(r), now_s);
}

AimdController::Reading AimdController::CloseWindow(const ClosedWindow& closed, double now_s,
                                                    std::int64_t active) {
  Reading r{.w = {}, .closed = closed, .now_s = now_s, .active = active, .has_samples = false};
  AimdWindow& w = r.w;
  w.end_s = now_s;
  w.num_frames = closed.num_frames;
  w.num_misses = num_misses_;
  w.num_over_bursts = num_over_bursts_;
  w.peak_active = closed.peak_active;
  w.num_limit_rejections = closed.num_limit_rejections;
  w.utilization = closed.load.utilization;
  w.binding = w.peak_active >= limit() - 1 || w.num_limit_rejections > 0;
  num_over_bursts_ = 0;
  if (options_.self_late_work_fraction > 0.0) LeaveOutSelfLate(w, num_over_low_);
  late_frames_.clear();
  late_frames_overflow_ = false;
  if (w.num_frames > 0) {
    w.miss_ratio = static_cast<double>(w.num_misses) / static_cast<double>(w.num_frames);
  }
  r.has_samples = !samples_.empty();
  if (r.has_samples) w.signal = Percentile(samples_, options_.percentile);
  last_window_ = w;
  raised_ = false;
  samples_.clear();
  sample_sessions_.clear();
  num_misses_ = 0;
  horizon_.push_back({.end_s = now_s, .frames = w.num_frames, .over_low = num_over_low_});
  horizon_frames_ += w.num_frames;
  horizon_over_low_ += num_over_low_;
  num_over_low_ = 0;
  while (horizon_.size() > 1 && horizon_.front().end_s < now_s - options_.growth_horizon_s) {
    horizon_frames_ -= horizon_.front().frames;
    horizon_over_low_ -= horizon_.front().over_low;
    horizon_.pop_front();
  }
  return r;
}

AimdController::LimitDecision AimdController::DecideWindow(const Reading& r) {
  if (phase_ == Phase::kCoolingDown) {
    if (std::optional<LimitDecision> d = OnCoolingDown(r)) return std::move(*d);
  }
  if (r.w.num_frames < options_.window.min_samples) return {};  // too little evidence: hold
  const GrowthInputs g = ReadGrowthInputs(r);
  if (std::optional<LimitDecision> d = OnCrossing(r)) return std::move(*d);
  switch (phase_) {
    case Phase::kSlowStart:
      return OnSlowStart(r, g);
    case Phase::kGrowing:
      return OnGrowing(r, g);
    case Phase::kHeldUntilDeparture:
      return OnHeldUntilDeparture(r, g);
    case Phase::kCoolingDown:
      break;  // OnCoolingDown left it, or decided
  }
  MTR_CHECK(false, "AIMD: a window evaluated while cooling down");
  return {};
}

void AimdController::Apply(LimitDecision d, double now_s) {
  switch (d.kind) {
    case LimitDecision::Kind::kHold:
      return;
    case LimitDecision::Kind::kCut:
      SetLimit(now_s, d.to, std::move(d.why));
      resume_phase_ = phase_;
      phase_ = Phase::kCoolingDown;
      last_cut_s_ = now_s;
      return;
    case LimitDecision::Kind::kGrow:
      raised_ = true;
      last_increase_s_ = now_s;
      SetLimit(now_s, d.to, std::move(d.why));
      return;
    case LimitDecision::Kind::kRecover:
      SetLimit(now_s, d.to, std::move(d.why));
      healthy_while_cooling_ = 0;
      phase_ = Phase::kHeldUntilDeparture;
      return;
  }
}

std::optional<AimdController::LimitDecision> AimdController::OnCoolingDown(const Reading& r) {
  const AimdWindow& w = r.w;
  if (options_.cooldown_mode == CooldownMode::kFixed) {
    if (r.now_s - last_cut_s_ < options_.cooldown_s) return LimitDecision{};
    phase_ = resume_phase_;
    return std::nullopt;
  }
  if (w.peak_active <= limit()) {
    phase_ = resume_phase_;  // the first window of the load the cut allows: act on it as usual
    return std::nullopt;
  }
  if (r.closed.least_active <= limit()) {
    healthy_while_cooling_ = 0;
    return LimitDecision{};  // sessions are leaving: wait for the first window at or under the
                             // limit
  }
  // The load admitted before the cut stayed the whole window (nobody left). Once it reads
  // healthy, under the low target at once or at or under the high target kRecoverWindows
  // windows in a row, the crossing has passed and the cut's limit is stale: it follows the
  // load just read (which admits nobody: active is not below it), and the next window
  // acts as usual.
  const bool measured = w.num_frames >= options_.window.min_samples && r.has_samples &&
                        w.miss_ratio <= options_.miss_ratio_threshold;
  healthy_while_cooling_ =
      measured && w.signal <= options_.high_target ? healthy_while_cooling_ + 1 : 0;
  if (!(measured &&
        (w.signal < options_.low_target || healthy_while_cooling_ >= kRecoverWindows))) {
    // Hold: the load of before the cut, still at a crossing (or not yet confirmed).
    return LimitDecision{};
  }
  std::int64_t to = std::min(r.closed.least_active, options_.window.max_limit);
  if (pool_bound_ >= 0) to = std::min(to, std::max(limit(), pool_bound_));
  // A wall (the last cut came from misses under a low latency) is not seen by the signal:
  // never past it on the signal's word; the drain decides there.
  if (miss_ceiling_ >= 0) to = std::min(to, miss_ceiling_);
  if (to <= limit()) return LimitDecision{};
  return LimitDecision{
      .kind = LimitDecision::Kind::kRecover,
      .to = to,
      .why = Format("recovered: p%g/D=%.3f <= %g over %lld frames with %lld active throughout, "
                    "the load admitted before the cut, which no session left; the limit "
                    "follows it",
                    options_.percentile, w.signal,
                    w.signal < options_.low_target ? options_.low_target : options_.high_target,
                    static_cast<long long>(w.num_frames),
                    static_cast<long long>(r.closed.least_active))};
}

AimdController::GrowthInputs AimdController::ReadGrowthInputs(const Reading& r) {
  const AimdWindow& w = r.w;
  GrowthInputs g;
  // Growth looks ahead to the load already admitted: windows still filling make every frame
  // cheaper than it will be, so the signal is projected to full KV, as if the KV-dependent share of
  // latency (kKvLatencyShare) grew in proportion to the KV held. Cuts, and the end of slow start
  // (a congestion signal), act on the signal as read.
  g.kv_growth = 1.0 + kKvLatencyShare * (1.0 / kv_fill_ - 1.0);
  g.growth_signal = w.signal * g.kv_growth;
  // The queue model's floor is compared with the signal at the same (full) KV: a floor read at an
  // emptier KV than the signal made the windows' filling read as queueing (qwen3-omni-30b-a3b:
  // 0.030 D at 1 session and 4% filled, 0.046 D at 45 sessions and 13%: "busy 0.35", projected
  // again to full KV, held slow start to +1 a window from 10 sessions on; 0.9 N_true after 225 s).
  if (w.signal > 0.0) floor_signal_ = std::min(floor_signal_, g.growth_signal);
  // The utilization cap: the sessions at which the engine's work utilization would reach
  // max_utilization, in proportion to the sessions the window carried throughout (sessions
  // admitted during it added less than a window's work, so this errs low); none while the steps
  // do not tell the step cost. Not projected to full KV like the signal: the step-cost fit follows
  // the KV as the windows fill (its time constant is StepCostFit::kFitTauS), and the latency
  // projection's worst case (a quarter of the cost growing with the KV) held moshi-7b's slow start
  // back by a third (0.9 N_true after 67 s instead of 49 s) with a cap that never bound. Read at
  // the slowest per-token cost of the recent past (StepCost::slowest_per_token_s): a session
  // admitted while a shared machine runs fast stays when it slows down. (Not the busy fraction
  // when the fit is unknown: moshi-7b's steps are mostly fixed cost, busy 0.81 at 8 sessions of
  // its 239, and that stand-in held the +1 law at 8.)
  const StepLoadWindow& load = r.closed.load;
  const double utilization_per_session =
      load.valid && r.closed.least_active > 0
          ? load.utilization_at_slowest / static_cast<double>(r.closed.least_active)
          : 0.0;
  g.utilization_capped = options_.max_utilization < 1.0 && utilization_per_session > 0.0;
  g.utilization_bound = g.utilization_capped ? options_.max_utilization / utilization_per_session
                                             : std::numeric_limits<double>::infinity();
  return g;
}

std::optional<AimdController::LimitDecision> AimdController::OnCrossing(const Reading& r) {
  const AimdWindow& w = r.w;
  const bool over_target =
      w.signal > options_.high_target || w.miss_ratio > options_.miss_ratio_threshold;
  // A short window's p99 is about its maximum, so one engine stall reads as a crossing. Count the
  // evidence in bursts of late frames instead of frames, over the consecutive crossing windows,
  // against the stall rate seen in the windows that did not cut: a rise that tracks the load
  // fills most slots at once; stalls that come at their usual rate hold the limit.
  const double slots =
      deadline_s_ > 0.0 ? r.closed.duration_s / (kBurstDeadlines * deadline_s_) : 0.0;
  if (over_target) {
    crossing_bursts_ += w.num_over_bursts;
    crossing_slots_ += slots;
    const bool confirmed =
        crossing_bursts_ >= kMinConfirmBursts &&
        PoissonTail(StallRate() * crossing_slots_, crossing_bursts_) < kStallFalseCut;
    if (!confirmed) return LimitDecision{};  // hold: not yet told from stalls
    const std::int64_t evidence_bursts = crossing_bursts_;
    const double evidence_slots = crossing_slots_;
    crossing_bursts_ = 0;
    crossing_slots_ = 0.0;
    return Cut(r, evidence_bursts, evidence_slots);
  }
  // The crossing windows before this one were stalls: they count towards the stall rate.
  const double added_slots = crossing_slots_ + slots;
  const double decay = std::exp(-added_slots * kBurstDeadlines * deadline_s_ / kStallRateTauS);
  stall_bursts_ = stall_bursts_ * decay + static_cast<double>(crossing_bursts_ + w.num_over_bursts);
  stall_slots_ = stall_slots_ * decay + added_slots;
  crossing_bursts_ = 0;
  crossing_slots_ = 0.0;
  return std::nullopt;
}

AimdController::LimitDecision AimdController::Cut(const Reading& r, std::int64_t evidence_bursts,
                                                  double evidence_slots) {
  const AimdWindow& w = r.w;
  const auto cut =
      static_cast<std::int64_t>(std::floor(options_.beta * static_cast<double>(r.active)));
  const std::int64_t to = std::min(limit(), std::max(options_.window.min_limit, cut));
  EndSlowStart();  // the first congestion signal ends slow start for good
  // Misses under a latency below the high target: a wall the signal does not see coming (the
  // pool running dry as windows fill). Remember where it was hit; see the growth cap in Grow.
  const bool wall = w.signal <= options_.high_target;
  if (wall) miss_ceiling_ = to;
  if (to >= limit()) return {};
  const std::string why =
      w.signal > options_.high_target
          ? Format("p%g/D=%.3f > %g", options_.percentile, w.signal, options_.high_target)
          : Format("miss ratio %.4f > %g", w.miss_ratio, options_.miss_ratio_threshold);
  return {.kind = LimitDecision::Kind::kCut,
          .to = to,
          .why = Format("cut: %s over %lld frames, %lld bursts of late frames in %.0f slots of %g "
                        "deadlines (stall rate %.3f a slot); floor(%g * active %lld) = %lld",
                        why.c_str(), static_cast<long long>(w.num_frames),
                        static_cast<long long>(evidence_bursts), evidence_slots, kBurstDeadlines,
                        StallRate(), options_.beta, static_cast<long long>(r.active),
                        static_cast<long long>(cut))};
}

AimdController::LimitDecision AimdController::OnSlowStart(const Reading& r, const GrowthInputs& g) {
  if (r.w.signal >= options_.slow_start_exit * options_.low_target ||
      static_cast<double>(limit()) >= options_.slow_start_exit * g.utilization_bound) {
    EndSlowStart();  // close to the target or to the utilization cap: no longer far below
    return OnGrowing(r, g);
  }
  if (!MayGrow(r, g)) return {};
  return Grow(r, g);
}

AimdController::LimitDecision AimdController::OnGrowing(const Reading& r, const GrowthInputs& g) {
  if (!MayGrow(r, g)) return {};
  return Grow(r, g);
}

AimdController::LimitDecision AimdController::OnHeldUntilDeparture(const Reading& r,
                                                                   const GrowthInputs& g) {
  if (!MayGrow(r, g)) return {};
  // After a recovery the limit is the load no session left since the cut: it grows again only
  // once one has (a window that carried less than the limit). Growth admits for good, a cut sheds
  // nothing while nobody leaves, so growing on the calm windows between bursts would ratchet the
  // load up past what the bursts say, each ratchet step a stall more per window.
  if (r.closed.least_active >= limit()) return {};
  phase_ = Phase::kGrowing;
  return Grow(r, g);
}

bool AimdController::MayGrow(const Reading& r, const GrowthInputs& g) const {
  return g.growth_signal < options_.low_target && r.w.binding && HorizonUnderLowTarget();
}

AimdController::Projection AimdController::ProjectCrossing(const Reading& r,
                                                           const GrowthInputs& g) const {
  // Projected low-target crossing, the lower of two extrapolations of latency in the active count
  // N. Proportional: s(N) ~ N. Saturating: continuous batching keeps latency near its floor until
  // the engine nears saturation, then it climbs steeply, s(N) = floor / (1 - N / N_sat) (a queue
  // whose busy fraction is N / N_sat), so this window's busy fraction is 1 - floor / s at the
  // window's KV, projected to full KV like the signal (the work grows with it), and the crossing is
  // N_sat (1 - floor / low_target) with both at full KV. The floor is the lowest signal seen, at
  // full KV: under-estimating the zero-load latency only lowers the projection (a safe error);
  // latency the queue does not amplify (jitter) raises it. The proportional one alone
  // saw 0.14 D at 1024 sessions of qwen25-omni-7b W=1024 (N_true 1135) and let slow
  // start double to 1317.
  const double n = static_cast<double>(r.w.peak_active);
  Projection p;
  p.crossing = g.growth_signal > 0.0 ? n * options_.low_target / g.growth_signal
                                     : static_cast<double>(options_.window.max_limit);
  const double busy = floor_signal_ < g.growth_signal ? 1.0 - floor_signal_ / g.growth_signal : 0.0;
  if (busy > 0.0 && floor_signal_ < kQueueModelFloor * options_.low_target) {
    const double projected = n * (1.0 - floor_signal_ / options_.low_target) / (busy * g.kv_growth);
    if (projected < p.crossing) {
      p.crossing = projected;
      p.saturating = true;
    }
  }
  return p;
}

AimdController::LimitDecision AimdController::Grow(const Reading& r, const GrowthInputs& g) {
  const Projection proj = ProjectCrossing(r, g);
  std::int64_t to = limit() + options_.increase_step;
  const char* phase = "additive";
  if (phase_ == Phase::kSlowStart) {
    const double grown =
        std::min(static_cast<double>(limit()) * options_.slow_start_factor, proj.crossing);
    to = std::max(to, static_cast<std::int64_t>(std::floor(grown)));
    phase = "slow start";
  } else if (options_.headroom_gain > 0.0) {
    const double step = options_.headroom_gain * (proj.crossing - static_cast<double>(limit()));
    to = std::max(to, limit() + static_cast<std::int64_t>(std::floor(step)));
    phase = "headroom";
  }
  // Above the limit of the last miss-triggered cut, only additive steps (TCP's ssthresh): the
  // latency that let the limit grow there before did not foresee the misses, and will not now.
  if (miss_ceiling_ >= 0 && to > miss_ceiling_) {
    to = std::max(miss_ceiling_, limit() + options_.increase_step);
    if (limit() >= miss_ceiling_) phase = "additive above the last miss cut";
  }
  // Past a calibrated prediction only by the least step, once per growth horizon: the prediction
  // rests on the engine's timed cost, which a shared machine's slow phases may not have shown.
  // And only on a window read at full KV (kPredictionKvFill): the prediction prices every window
  // full, and a window read while they fill sees a cheaper engine than that, by more than the
  // signal's projection assumes where attention is a large share of a frame (drive, a 30B MoE,
  // W 2048, 1 s frames: seeded at the predicted 1, grown to 2 at 18% filled on p99 0.62 D
  // projected; full, their frames of ~0.46 s each needed ~0.9 of the engine: 38% came late).
  const bool paced = r.now_s - last_increase_s_ >= options_.growth_horizon_s;
  if (options_.predicted_limit > 0 && to > options_.predicted_limit) {
    const bool may_pass = paced && kv_fill_ >= kPredictionKvFill;
    to = std::max(options_.predicted_limit, may_pass ? limit() + options_.increase_step : limit());
    if (limit() >= options_.predicted_limit) phase = "paced above the predicted N*";
  }
  // Near saturation no multiplicative or headroom jump past the projection; the least step
  // stays, so the limit still walks into the dead band where the two projections disagree.
  if (proj.saturating) {
    // Past the projection only by the least step, and only once the growth horizon has passed at
    // the current limit: there latency comes in episodes that a few calm windows do not rule out
    // (the CPU engine walked +1 a window from 48 to 76 sessions between its episodes).
    to = std::min(to, std::max(paced ? limit() + options_.increase_step : limit(),
                               static_cast<std::int64_t>(std::floor(proj.crossing))));
  }
  // The utilization cap is hard (no least step past it): above it the calm windows between
  // episodes would let the limit walk on by steps.
  if (g.utilization_capped && static_cast<double>(to) > g.utilization_bound) {
    to = std::min(to, static_cast<std::int64_t>(std::floor(g.utilization_bound)));
  }
  to = std::min(options_.window.max_limit, to);
  if (pool_bound_ >= 0 && to >= pool_bound_) {
    to = std::max(limit(), pool_bound_);
    EndSlowStart();  // the KV guard's memory bound ends slow start too
  }
  if (to <= limit()) return {};
  return {.kind = LimitDecision::Kind::kGrow,
          .to = to,
          .why = IncreaseReason(r, g, phase, proj.crossing)};
}

std::string AimdController::IncreaseReason(const Reading& r, const GrowthInputs& g,
                                           const char* phase, double crossing) const {
  const AimdWindow& w = r.w;
  const StepLoadWindow& load = r.closed.load;
  return Format(
      "increase (%s): p%g/D=%.3f%s < %g over %lld frames, binding (peak active %lld, "
      "%lld limit rejections), %lld of %lld frames of %gs over it; projected low-target "
      "crossing %.0f%s%s",
      phase, options_.percentile, w.signal,
      kv_fill_ < 1.0
          ? Format(" (%.3f at full KV: %.0f%% filled)", g.growth_signal, 100.0 * kv_fill_).c_str()
          : "",
      options_.low_target, static_cast<long long>(w.num_frames),
      static_cast<long long>(w.peak_active), static_cast<long long>(w.num_limit_rejections),
      static_cast<long long>(horizon_over_low_), static_cast<long long>(horizon_frames_),
      options_.growth_horizon_s, crossing,
      g.utilization_capped
          ? Format(", work utilization %.2f, %.2f at the slowest recent speed (cap %g at %.0f "
                   "sessions)",
                   load.utilization, load.utilization_at_slowest, options_.max_utilization,
                   g.utilization_bound)
                .c_str()
          : "",
      pool_bound_ >= 0 ? Format(", pool bound %lld", static_cast<long long>(pool_bound_)).c_str()
                       : "");
}

bool AimdController::HorizonUnderLowTarget() const {
  const auto frames = static_cast<double>(horizon_frames_);
  const double rank = std::ceil(options_.percentile / 100.0 * frames);
  return static_cast<double>(horizon_over_low_) <= frames - rank;
}

std::string AimdController::Describe() const {
  return Format(
             "aimd(window_s=%g, percentile=%g, low_target=%gD, high_target=%gD, "
             "miss_ratio_threshold=%g, increase_step=%lld, slow_start_factor=%g, "
             "slow_start_exit=%g, headroom_gain=%g, growth_horizon_s=%g, max_utilization=%g, "
             "self_late_work_fraction=%g, beta=%g, "
             "cooldown=%s, ",
             options_.window.window_s, options_.percentile, options_.low_target,
             options_.high_target, options_.miss_ratio_threshold,
             static_cast<long long>(options_.increase_step), options_.slow_start_factor,
             options_.slow_start_exit, options_.headroom_gain, options_.growth_horizon_s,
             options_.max_utilization, options_.self_late_work_fraction, options_.beta,
             options_.cooldown_mode == CooldownMode::kDrain
                 ? "drain"
                 : Format("fixed %gs", options_.cooldown_s).c_str()) +
         Format(
             "window_frames=%lld, min_window_s=%g, initial_limit=%lld, predicted_limit=%lld, "
             "min_limit=%lld, max_limit=%lld, min_samples=%lld, max_samples=%lld, kv_guard=%s",
             static_cast<long long>(options_.window.window_frames), options_.window.min_window_s,
             static_cast<long long>(options_.initial_limit),
             static_cast<long long>(options_.predicted_limit),
             static_cast<long long>(options_.window.min_limit),
             static_cast<long long>(options_.window.max_limit),
             static_cast<long long>(options_.window.min_samples),
             static_cast<long long>(options_.max_samples),
             options_.window.kv_guard ? "on" : "off") +
         (options_.window.kv_guard
              ? Format(", full_mode_session_s=%g, headroom_fraction=%g)",
                       memory().full_mode_session_s, memory().headroom_fraction)
              : std::string(")"));
}

}  // namespace metronome::admission
