#include "metronome/serving/engine_backend.h"

#include <chrono>

namespace metronome::serving {

EngineBackend::EngineBackend(engine::Engine* engine, const engine::SamplerOptions& sampling,
                             TokenPos max_context)
    : engine_(engine), sampler_(sampling), max_context_(max_context) {}

BackendSessionId EngineBackend::Open(const kv::KvPolicy& policy, TokenPos max_context) {
  engine::SessionOptions so;
  so.policy = policy;
  // A window session streams for as long as it lives; only full KV has a context to run out of.
  if (policy.mode == kv::KvMode::kFull) {
    const TokenPos limit = full_kv_context_limit();
    so.max_context =
        max_context > 0 && (limit <= 0 || max_context < limit) ? max_context : max_context_;
  }
  return static_cast<BackendSessionId>(engine_->OpenSession(so));
}

void EngineBackend::Close(BackendSessionId id) {
  engine_->CloseSession(engine::SessionId{static_cast<std::uint32_t>(id)});
}

double EngineBackend::Step(std::span<const BackendItem> items,
                           std::vector<BackendItemResult>* out) {
  items_.clear();
  for (const BackendItem& it : items) {
    items_.push_back({engine::SessionId{static_cast<std::uint32_t>(it.session)}, it.tokens,
                      it.want_next_token ? engine::LogitsMode::kLast : engine::LogitsMode::kNone});
  }
  const auto t0 = std::chrono::steady_clock::now();
  engine_->Step(items_, &results_);
  out->assign(items.size(), BackendItemResult{});
  for (std::size_t i = 0; i < items.size(); ++i) {
    (*out)[i].status = results_[i].status;
    if (results_[i].status == engine::StepStatus::kOk && results_[i].num_logits_rows > 0) {
      const int row = results_[i].first_logits_row;
      // Only the rows sampled are checked: the item fails alone, the step's others keep theirs.
      if (engine_->logits_finite(row)) {
        (*out)[i].next_token = sampler_.Sample(engine_->logits(row));
      } else {
        (*out)[i].status = engine::StepStatus::kNonFiniteLogits;
      }
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::int64_t EngineBackend::resident_blocks(BackendSessionId id) const {
  const kv::SessionKv* kv = engine_->session_kv(engine::SessionId{static_cast<std::uint32_t>(id)});
  return kv == nullptr ? 0 : kv->resident_blocks();
}

}  // namespace metronome::serving
