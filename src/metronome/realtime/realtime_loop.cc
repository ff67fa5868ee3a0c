#include "metronome/realtime/realtime_loop.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include "metronome/base/errors.h"
#include "metronome/realtime/session_state.h"

namespace metronome::realtime {

double RealtimeLoop::Seconds(Nanos t) const {
  return std::chrono::duration<double>(t - origin_).count();
}
double RealtimeLoop::Now() const { return Seconds(clock_->Now()); }

void SessionSpec::Validate() const {
  if (!(period_ms > 0.0 && period_ms <= 3.6e6)) {
    throw ConfigError("period_ms = " + std::to_string(period_ms) + " must be in (0, 3600000]");
  }
  if (!(deadline_ms > 0.0 && deadline_ms <= 3.6e6)) {
    throw ConfigError("deadline_ms = " + std::to_string(deadline_ms) +
                      " must be in (0, 3600000] (ResolveSession turns an absent or 0 deadline "
                      "into the period)");
  }
  if (input_tokens_per_frame < 1 || input_tokens_per_frame > 65536) {
    throw ConfigError("tokens_per_frame = " + std::to_string(input_tokens_per_frame) +
                      " must be in [1, 65536]");
  }
  if (output_tokens_per_frame < 0 || output_tokens_per_frame > 65536) {
    throw ConfigError("output_tokens_per_frame = " + std::to_string(output_tokens_per_frame) +
                      " must be in [0, 65536]");
  }
  if (max_pending_frames < 1 || max_pending_frames > 1024) {
    throw ConfigError("max_pending_frames = " + std::to_string(max_pending_frames) +
                      " must be in [1, 1024]");
  }
  if (max_context_tokens < 0) {
    throw ConfigError("max_context_tokens = " + std::to_string(max_context_tokens) +
                      " must be >= 0 (0: the backend's limit)");
  }
  if (!(phase_ms >= 0.0 && phase_ms < period_ms)) {
    throw ConfigError("phase_ms = " + std::to_string(phase_ms) + " must be in [0, period_ms)");
  }
  policy.Validate();
}

void FramePacing::Validate() const {
  if (burst_frames < 1 || burst_frames > 1024) {
    throw ConfigError("pacing.burst_frames = " + std::to_string(burst_frames) +
                      " must be in [1, 1024]");
  }
  if (!(jitter_ms >= 0.0 && jitter_ms <= 3.6e6)) {
    throw ConfigError("pacing.jitter_ms = " + FormatValue(jitter_ms) + " must be in [0, 3600000]");
  }
}

Nanos FramePacing::Tolerance(Nanos period) const {
  return std::max(period * (burst_frames - 1), FromMs(jitter_ms));
}

void PromptPacing::Validate() const {
  if (!(c1_s_per_token >= 0.0 && c2_s_per_kv_token >= 0.0 && std::isfinite(c1_s_per_token) &&
        std::isfinite(c2_s_per_kv_token))) {
    throw ConfigError("prompt.c1_s_per_token and prompt.c2_s_per_kv_token must be finite and >= 0");
  }
  if (!(deadline_fraction > 0.0 && deadline_fraction <= 1.0)) {
    throw ConfigError("prompt.deadline_fraction = " + FormatValue(deadline_fraction) +
                      " must be in (0, 1]");
  }
}

void LoopOptions::Validate() const {
  if (mute_after_starved < 1) {
    throw ConfigError("mute_after_starved = " + std::to_string(mute_after_starved) +
                      " must be >= 1");
  }
  if (max_step_tokens < 0) {
    throw ConfigError("max_step_tokens = " + std::to_string(max_step_tokens) +
                      " must be >= 0 (0: no limit)");
  }
  pacing.Validate();
  prompt.Validate();
}

double RealtimeLoop::TightestDeadlineMs() const {
  double tightest = std::numeric_limits<double>::infinity();
  for (const auto& [id, s] : sessions_) {
    if (s.prompt_fed) tightest = std::min(tightest, s.spec.deadline_ms);
  }
  return tightest;
}

int RealtimeLoop::PromptChunkTokens(const kv::KvPolicy& policy, TokenPos pos, int wanted, int least,
                                    double* budget_s) const {
  const PromptPacing& p = options_.prompt;
  const auto work_s = [&](int k) {
    return p.c1_s_per_token * k +
           p.c2_s_per_kv_token * static_cast<double>(policy.VisibleKeysOfChunk(pos, k));
  };
  // The work grows with k: the largest k within the budget, by bisection (at least `least`).
  int lo = std::min(least, wanted);
  int hi = wanted;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (work_s(mid) <= *budget_s) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  *budget_s -= work_s(lo);
  return lo;
}

RealtimeLoop::RealtimeLoop(Backend* backend, Clock* clock, const LoopOptions& options)
    : backend_(backend), clock_(clock), options_(options) {
  options.Validate();
}

RealtimeSessionId RealtimeLoop::AddSession(const SessionSpec& spec) {
  spec.Validate();
  Session s;
  s.spec = spec;
  s.backend_id = backend_->Open(spec.policy, spec.max_context_tokens);
  s.start = clock_->Now() + FromMs(spec.phase_ms);
  s.next_arrival = s.start;
  s.prompt_fed = spec.prompt.empty();
  s.prompt_in = s.prompt_fed ? Nanos::min() : Nanos::max();
  const RealtimeSessionId id = next_id_++;
  const Nanos first = s.next_arrival;
  Session& stored = sessions_.emplace(id, std::move(s)).first->second;
  if (!spec.external_frames) arrivals_.push({first, id, &stored});
  return id;
}

RealtimeLoop::SubmitResult RealtimeLoop::SubmitFrame(RealtimeSessionId id,
                                                     std::vector<TokenId> tokens,
                                                     std::optional<Nanos> arrival) {
  const auto it = sessions_.find(id);
  if (it == sessions_.end()) return SubmitResult::kUnknownSession;
  Session& s = it->second;
  if (!s.spec.external_frames) return SubmitResult::kNotExternal;
  if (static_cast<int>(s.frames.size()) >= s.spec.max_pending_frames) {
    return SubmitResult::kTooEarly;
  }
  // Never later than now: a stamp from another thread may trail this thread's clock read.
  const Nanos now = clock_->Now();
  const Nanos at = std::min(arrival.value_or(now), now);
  const Nanos period = FromMs(s.spec.period_ms);
  if (s.rate_tat != Nanos::min() && s.rate_tat - at > options_.pacing.Tolerance(period)) {
    return SubmitResult::kTooFast;
  }
  if (tokens.empty()) return SubmitResult::kEmpty;
  if (std::cmp_greater(tokens.size(), s.spec.input_tokens_per_frame)) return SubmitResult::kTooMany;
  s.rate_tat = (s.rate_tat == Nanos::min() ? at : std::max(s.rate_tat, at)) + period;
  Frame f;
  f.index = s.next_index++;
  f.arrival = at;
  f.deadline = f.arrival + FromMs(s.spec.deadline_ms);
  f.input = std::move(tokens);
  s.frames.push_back(std::move(f));
  if (!s.ready) {
    s.ready = true;
    // Keep ready_ sorted by id (sessions are served in id order).
    const auto pos = std::lower_bound(ready_.begin(), ready_.end(),
                                      std::pair<RealtimeSessionId, Session*>{id, nullptr});
    ready_.insert(pos, {id, &s});
  }
  return SubmitResult::kOk;
}

bool RealtimeLoop::ExportSession(RealtimeSessionId id, SessionState* state) const {
  const auto it = sessions_.find(id);
  if (it == sessions_.end() || !it->second.spec.external_frames || !it->second.frames.empty()) {
    return false;
  }
  const Session& s = it->second;
  state->backend = backend_->ExportSession(s.backend_id);
  if (state->backend.empty()) return false;
  state->spec = s.spec;
  if (s.prompt_fed) state->spec.prompt.clear();
  state->next_frame = s.next_index;
  state->prompt_fed = s.prompt_fed;
  state->pending_output = s.pending_output;
  state->consecutive_starved = s.consecutive_starved;
  return true;
}

BackendImport RealtimeLoop::ImportSession(const SessionState& state, RealtimeSessionId* id) {
  SessionSpec spec = state.spec;
  spec.external_frames = true;
  spec.phase_ms = 0.0;
  spec.Validate();
  BackendImport imported =
      backend_->ImportSession(spec.policy, spec.max_context_tokens, state.backend);
  if (!imported.ok()) return imported;
  Session s;
  s.spec = std::move(spec);
  s.backend_id = imported.id;
  s.start = clock_->Now();
  s.next_arrival = s.start;
  s.next_index = state.next_frame;
  s.prompt_fed = state.prompt_fed || s.spec.prompt.empty();
  s.prompt_in = s.prompt_fed ? Nanos::min() : Nanos::max();
  s.pending_output = state.pending_output;
  s.consecutive_starved = state.consecutive_starved;
  *id = next_id_++;
  sessions_.emplace(*id, std::move(s));
  return imported;
}

bool RealtimeLoop::HasFrames(RealtimeSessionId id) const {
  const auto it = sessions_.find(id);
  return it != sessions_.end() && !it->second.frames.empty();
}

const SessionSpec* RealtimeLoop::session_spec(RealtimeSessionId id) const {
  const auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second.spec;
}

std::int64_t RealtimeLoop::next_frame(RealtimeSessionId id) const {
  const auto it = sessions_.find(id);
  return it == sessions_.end() ? 0 : it->second.next_index;
}

void RealtimeLoop::EndSession(RealtimeSessionId id) {
  const auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  if (it->second.ready) {
    std::erase_if(ready_, [id](const auto& entry) { return entry.first == id; });
  }
  Retire(it);
}

void RealtimeLoop::Retire(SessionMap::iterator it) {
  backend_->Close(it->second.backend_id);
  if (it->second.spec.external_frames) {
    sessions_.erase(it);  // no arrivals_ entry points at it
    return;
  }
  const RealtimeSessionId id = it->first;
  SessionMap::node_type node = sessions_.extract(it);
  Session& s = node.mapped();
  s.ended = true;
  // Until its arrivals_ entry pops (within one period) the node keeps only its fixed size.
  s.frames = {};
  s.chunk = {};
  s.spec.prompt = {};
  ended_.emplace(id, std::move(node));
}

std::vector<RealtimeSessionId> RealtimeLoop::session_ids() const {
  std::vector<RealtimeSessionId> ids;
  ids.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) ids.push_back(id);
  return ids;
}

LoopFootprint RealtimeLoop::footprint() const {
  return {.sessions = static_cast<std::int64_t>(sessions_.size()),
          .retired = static_cast<std::int64_t>(ended_.size()),
          .arrivals = static_cast<std::int64_t>(arrivals_.size()),
          .ready = static_cast<std::int64_t>(ready_.size())};
}

std::int64_t RealtimeLoop::resident_blocks(RealtimeSessionId id) const {
  const auto it = sessions_.find(id);
  return it == sessions_.end() ? 0 : backend_->resident_blocks(it->second.backend_id);
}

void RealtimeLoop::ReleaseArrivals(Nanos now) {
  bool added = false;
  while (!arrivals_.empty() && arrivals_.top().t <= now) {
    const Arrival a = arrivals_.top();
    arrivals_.pop();
    if (a.session->ended) {
      ended_.erase(a.id);  // its last reference is gone
      continue;
    }
    const RealtimeSessionId id = a.id;
    Session& s = *a.session;
    while (s.next_arrival <= now) {
      Frame f;
      f.index = s.next_index++;
      f.arrival = s.next_arrival;
      f.deadline = f.arrival + FromMs(s.spec.deadline_ms);
      s.frames.push_back(std::move(f));
      // Drift-free: arrival i is start + i * period, never now + period.
      s.next_arrival = s.start + FromMs(static_cast<double>(s.next_index) * s.spec.period_ms);
    }
    arrivals_.push({s.next_arrival, id, &s});
    if (!s.ready) {
      s.ready = true;
      ready_.emplace_back(id, &s);
      added = true;
    }
  }
  // Sessions are served in id order every iteration, as if iterating them all.
  if (added) std::sort(ready_.begin(), ready_.end());
}

void RealtimeLoop::Deliver(RealtimeSessionId id, Session& s, Nanos when, FrameOutcome outcome) {
  Frame& f = s.frames.front();
  FrameRecord r;
  r.session = id;
  r.index = f.index;
  r.arrival_s = Seconds(f.arrival);
  r.delivered_s = Seconds(when);
  r.latency_ms = std::chrono::duration<double, std::milli>(when - f.arrival).count();
  const double now = r.delivered_s;
  r.outcome = outcome;
  r.deadline_ms = s.spec.deadline_ms;
  r.resident_blocks = backend_->resident_blocks(s.backend_id);
  r.behind_own_prompt = f.arrival < s.prompt_in;
  r.tokens = std::move(f.outputs);
  if (!r.tokens.empty()) s.pending_output = r.tokens.back();
  s.frames.pop_front();

  stats_.Count(outcome);
  if (outcome == FrameOutcome::kStarved) {
    if (std::isnan(stats_.first_starved_at_s)) stats_.first_starved_at_s = now;
    if (++s.consecutive_starved == options_.mute_after_starved) {
      ++stats_.mute_alarms;
      if (observer_ != nullptr) {
        const kv::PoolStats pool = backend_->pool();
        observer_->OnMuteAlarm({.session = id,
                                .t_s = now,
                                .consecutive_starved = s.consecutive_starved,
                                .alarms_so_far = stats_.mute_alarms,
                                .used_blocks = pool.used_blocks,
                                .total_blocks = pool.num_blocks});
      }
    }
  } else {
    s.consecutive_starved = 0;
  }
  if (observer_ != nullptr) observer_->OnFrame(r);
}

void RealtimeLoop::DeliverExpired() {
  const Nanos now = clock_->Now();
  for (auto& [id, sp] : ready_) {
    Session& s = *sp;
    // A frame blocked on the pool is handed back at its deadline with what it has: the silent
    // failure of KV-pool engines, here counted. A frame that is merely slow keeps computing and
    // completes late.
    while (!s.frames.empty() && s.frames.front().blocked && now >= s.frames.front().deadline) {
      const bool empty = s.frames.front().outputs.empty();
      Deliver(id, s, s.frames.front().deadline,
              empty ? FrameOutcome::kStarved : FrameOutcome::kShort);
    }
  }
}

Nanos RealtimeLoop::NextEventTime() const {
  // The heap's top may belong to an ended session: at worst one early wake-up.
  Nanos t = arrivals_.empty() ? Nanos::max() : arrivals_.top().t;
  for (const auto& [id, sp] : ready_) {
    const Session& s = *sp;
    if (!s.frames.empty() && s.frames.front().blocked) t = std::min(t, s.frames.front().deadline);
  }
  return t;
}

void RealtimeLoop::CompactReady() {
  std::erase_if(ready_, [](const auto& entry) {
    if (entry.second == nullptr) return true;  // ended during the iteration
    if (!entry.second->frames.empty()) return false;
    entry.second->ready = false;
    return true;
  });
}

std::int64_t RealtimeLoop::CollectCandidates() {
  // Plan: one candidate per session with an arrived, unfinished frame: the rest of its input
  // (prompt, the previous frame's last output, the frame's tokens) or its next decode token.
  candidates_.clear();
  const int vocab = backend_->vocab_size();
  std::int64_t ready_tokens = 0;
  for (std::size_t k = 0; k < ready_.size(); ++k) {
    const RealtimeSessionId id = ready_[k].first;
    Session& s = *ready_[k].second;
    if (s.frames.empty()) continue;
    Frame& f = s.frames.front();
    s.chunk.clear();
    if (!f.input_fed) {
      // Rebuilt the same way every iteration until the whole input is fed (prompt_fed and
      // pending_output change only then), so a budget-split input continues where it stopped.
      if (!s.prompt_fed) s.chunk = s.spec.prompt;
      if (s.pending_output >= 0) s.chunk.push_back(s.pending_output);
      if (s.spec.external_frames) {
        s.chunk.insert(s.chunk.end(), f.input.begin(), f.input.end());
      }
      // Otherwise input tokens stand in for the session's stream (codec or text tokens):
      // deterministic ids.
      for (int i = 0; !s.spec.external_frames && i < s.spec.input_tokens_per_frame; ++i) {
        const auto v = static_cast<std::int64_t>(
            id * 7919 + static_cast<std::uint64_t>(f.index) * 131 + static_cast<std::uint64_t>(i));
        s.chunk.push_back(static_cast<TokenId>(v % vocab));
      }
    } else {
      s.chunk.push_back(f.outputs.back());
    }
    const int tokens = static_cast<int>(s.chunk.size()) - f.input_offset;
    const bool prompt = !f.input_fed && !s.prompt_fed;
    candidates_.push_back(
        {.deadline = f.deadline, .ready_index = k, .tokens = tokens, .prompt = prompt});
    ready_tokens += tokens;
  }
  return ready_tokens;
}

void RealtimeLoop::PlanStep(std::int64_t ready_tokens) {
  // Over the budget: prompts last, then earliest deadline first (then session id), the last item
  // split to fit.
  const int budget = options_.max_step_tokens;
  if (budget > 0 && ready_tokens > budget) {
    std::sort(candidates_.begin(), candidates_.end(), [](const Planned& a, const Planned& b) {
      if (a.prompt != b.prompt) return b.prompt;
      return a.deadline != b.deadline ? a.deadline < b.deadline : a.ready_index < b.ready_index;
    });
  }
  items_.clear();
  planned_.clear();
  std::int64_t budget_left = budget > 0 ? budget : std::numeric_limits<std::int64_t>::max();
  // PromptPacing's budget for this step's prompt work, s (NaN until a prompt asks: O(live
  // sessions), only in a step that carries a prompt). The first prompt chunk of a step takes at
  // least one token, so prompts progress.
  double prompt_budget_s = std::numeric_limits<double>::quiet_NaN();
  bool prompt_planned = false;
  for (Planned c : candidates_) {
    if (budget_left <= 0) break;
    Session& s = *ready_[c.ready_index].second;
    const Frame& f = s.frames.front();
    int take = static_cast<int>(std::min<std::int64_t>(c.tokens, budget_left));
    if (c.prompt && budget > 0 && options_.prompt.enabled()) {
      if (std::isnan(prompt_budget_s)) {
        prompt_budget_s = options_.prompt.deadline_fraction * TightestDeadlineMs() / 1000.0;
      }
      take = PromptChunkTokens(s.spec.policy, f.input_offset, take, prompt_planned ? 0 : 1,
                               &prompt_budget_s);
      if (take == 0) continue;
      prompt_planned = true;
    }
    c.completes_input = take == c.tokens;
    // input_offset is 0 once the input is fed: a decode item is the chunk's one token.
    items_.push_back({s.backend_id, std::span<const TokenId>(s.chunk).subspan(f.input_offset, take),
                      c.completes_input && s.spec.output_tokens_per_frame > 0});
    c.tokens = take;
    planned_.push_back(c);
    budget_left -= take;
  }
}

void RealtimeLoop::AdvanceFrame(RealtimeSessionId id, Session& s, const Planned& p,
                                const BackendItemResult& result, Nanos done) {
  Frame& f = s.frames.front();
  if (!p.completes_input) {
    f.input_offset += p.tokens;  // the rest of the input follows in later steps
    return;
  }
  if (!f.input_fed) {
    f.input_fed = true;
    f.input_offset = 0;
    if (!s.prompt_fed) {
      // The prompt is in the KV now: drop the session's copies (up to max_prompt_tokens ids
      // each, for the rest of its life otherwise). The step is over, so no item points at them.
      s.prompt_fed = true;
      s.prompt_in = done;
      s.spec.prompt = {};
      s.chunk.shrink_to_fit();
    }
    s.pending_output = -1;
  }
  if (s.spec.output_tokens_per_frame > 0) f.outputs.push_back(result.next_token);
  if (static_cast<int>(f.outputs.size()) >= s.spec.output_tokens_per_frame) {
    Deliver(id, s, done, done <= f.deadline ? FrameOutcome::kOk : FrameOutcome::kLate);
  }
}

bool RealtimeLoop::RunIteration() {
  const Nanos now = clock_->Now();
  ReleaseArrivals(now);
  DeliverExpired();
  PlanStep(CollectCandidates());
  if (items_.empty()) {
    CompactReady();
    return false;
  }

  const double duration = backend_->Step(items_, &results_);
  ++stats_.iterations;
  // Virtual clock: jump by the step's (modelled or timed) duration. Real clock: the time has
  // passed already and this returns at once.
  clock_->SleepUntil(now + Nanos(std::llround(duration * 1e9)));
  const Nanos done = std::max(clock_->Now(), now + Nanos(std::llround(duration * 1e9)));

  bool progressed = false;
  int batch_tokens = 0;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    auto& entry = ready_[planned_[i].ready_index];
    const RealtimeSessionId id = entry.first;
    Session& s = *entry.second;
    Frame& f = s.frames.front();
    const BackendItemResult& r = results_[i];
    if (r.status == StepStatus::kPoolExhausted) {
      f.blocked = true;
      continue;
    }
    if (r.status != StepStatus::kOk) {
      // The full-mode context limit, or any other refusal of the backend: the session ends with
      // an explicit reason, never silently. Only the first is a context-full session; logits the
      // model could not sample from have their own reason (the model, not the session, is at
      // fault: operators alert on it).
      const bool context_full = r.status == StepStatus::kContextFull;
      ++(context_full ? stats_.context_full_sessions : stats_.error_sessions);
      const EndReason reason = context_full ? EndReason::kContextFull
                               : r.status == StepStatus::kNonFiniteLogits
                                   ? EndReason::kNonFiniteLogits
                                   : EndReason::kError;
      entry.second = nullptr;
      Retire(sessions_.find(id));
      if (observer_ != nullptr) {
        observer_->OnSessionEnded(
            {.session = id, .t_s = Seconds(done), .reason = reason, .status = r.status});
      }
      continue;
    }
    progressed = true;
    batch_tokens += static_cast<int>(items_[i].tokens.size());
    f.blocked = false;
    AdvanceFrame(id, s, planned_[i], r, done);
  }
  CompactReady();
  if (on_iteration) on_iteration(duration, batch_tokens);
  return progressed;
}

void RealtimeLoop::RunOnce(double t_limit_s) {
  if (RunIteration()) return;
  // Nothing ran (or everything is blocked on the pool): wait for the next arrival or deadline.
  // Every event is strictly in the future here (due arrivals were released, due deadlines
  // delivered), so this always makes progress.
  // Rounded up, so a caller's event at t_limit_s is due (Now() >= it) when this returns.
  const Nanos limit = origin_ + Nanos(static_cast<std::int64_t>(std::ceil(t_limit_s * 1e9)));
  const Nanos now = clock_->Now();
  if (now >= limit) return;
  clock_->SleepUntil(std::max(std::min(NextEventTime(), limit), now + Nanos(1)));
}

double RealtimeLoop::NextEventSeconds() const {
  const Nanos t = NextEventTime();
  return t == Nanos::max() ? std::numeric_limits<double>::infinity() : Seconds(t);
}

void RealtimeLoop::RunUntil(double t_end_s) {
  const Nanos end = origin_ + Nanos(std::llround(t_end_s * 1e9));
  while (clock_->Now() < end) RunOnce(t_end_s);
}

}  // namespace metronome::realtime
