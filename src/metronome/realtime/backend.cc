#include "metronome/realtime/backend.h"

#include <chrono>

#include "metronome/base/errors.h"

namespace metronome::realtime {

CostModelBackend::CostModelBackend(const CostModel& cost, std::int64_t num_blocks, int block_tokens)
    : cost_(cost), pool_({1, 1, 1, block_tokens}, {.num_blocks = static_cast<int>(num_blocks)}) {}

BackendSessionId CostModelBackend::Open(const kv::KvPolicy& policy, TokenPos max_context) {
  policy.Validate();
  const BackendSessionId id = next_id_++;
  const bool limited = policy.mode == kv::KvMode::kFull && max_context > 0;
  sessions_.emplace(
      id, std::make_unique<kv::SessionKv>(
              &pool_, policy, limited ? max_context : std::numeric_limits<TokenPos>::max() / 4));
  return id;
}

void CostModelBackend::Close(BackendSessionId id) {
  const auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  sessions_.erase(it);
}

double CostModelBackend::Step(std::span<const BackendItem> items,
                              std::vector<BackendItemResult>* out) {
  out->assign(items.size(), BackendItemResult{});
  double batch_tokens = 0.0;
  double visible = 0.0;
  std::vector<std::pair<kv::SessionKv*, int>> commits;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto it = sessions_.find(items[i].session);
    if (it == sessions_.end()) {
      (*out)[i].status = engine::StepStatus::kUnknownSession;
      continue;
    }
    kv::SessionKv& kv = *it->second;
    const int n = static_cast<int>(items[i].tokens.size());
    switch (kv.Reserve(n)) {
      case kv::ReserveResult::kOk:
        break;
      case kv::ReserveResult::kPoolExhausted:
        (*out)[i].status = engine::StepStatus::kPoolExhausted;
        continue;
      case kv::ReserveResult::kContextFull:
        (*out)[i].status = engine::StepStatus::kContextFull;
        continue;
    }
    visible += static_cast<double>(kv.policy().VisibleKeysOfChunk(kv.length(), n));
    batch_tokens += n;
    commits.emplace_back(&kv, n);
    // A deterministic stand-in for the model's output.
    (*out)[i].next_token = static_cast<TokenId>((kv.length() + n) % 997);
  }
  for (auto& [kv, n] : commits) kv->Commit(n);
  return items.empty() ? 0.0 : cost_.StepSeconds(batch_tokens, visible);
}

kv::PoolStats CostModelBackend::pool() const {
  return kv::PoolStatsOf(pool_, static_cast<std::int64_t>(sessions_.size()));
}

std::int64_t CostModelBackend::resident_blocks(BackendSessionId id) const {
  const auto it = sessions_.find(id);
  return it == sessions_.end() ? 0 : it->second->resident_blocks();
}

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
      (*out)[i].next_token = sampler_.Sample(engine_->logits(results_[i].first_logits_row));
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::int64_t EngineBackend::resident_blocks(BackendSessionId id) const {
  const kv::SessionKv* kv = engine_->session_kv(engine::SessionId{static_cast<std::uint32_t>(id)});
  return kv == nullptr ? 0 : kv->resident_blocks();
}

}  // namespace metronome::realtime
