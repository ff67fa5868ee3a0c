#include "metronome/serving/engine_backend.h"

#include <chrono>
#include <utility>

#include "metronome/base/byte_io.h"

namespace metronome::serving {
namespace {

// The sampler's state is text of decimal numbers; a longer one is not a sampler's.
constexpr std::size_t kMaxSamplerStateBytes = 1 << 16;

}  // namespace

EngineBackend::EngineBackend(engine::Engine* engine, const engine::SamplerOptions& sampling,
                             TokenPos max_context)
    : engine_(engine),
      sampling_(sampling),
      model_identity_(model::ModelIdentity(engine->model())),
      max_context_(max_context) {
  sampling_.Validate();
}

engine::SessionOptions EngineBackend::SessionOptionsFor(const kv::KvPolicy& policy,
                                                        TokenPos max_context) const {
  engine::SessionOptions so;
  so.policy = policy;
  // A window session streams for as long as it lives; only full KV has a context to run out of.
  if (policy.mode == kv::KvMode::kFull) {
    const TokenPos limit = full_kv_context_limit();
    so.max_context =
        max_context > 0 && (limit <= 0 || max_context < limit) ? max_context : max_context_;
  }
  return so;
}

BackendSessionId EngineBackend::Open(const kv::KvPolicy& policy, TokenPos max_context) {
  const auto id =
      static_cast<BackendSessionId>(engine_->OpenSession(SessionOptionsFor(policy, max_context)));
  samplers_.insert_or_assign(id, engine::Sampler(sampling_));
  return id;
}

void EngineBackend::Close(BackendSessionId id) {
  engine_->CloseSession(engine::SessionId{static_cast<std::uint32_t>(id)});
  samplers_.erase(id);
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
        (*out)[i].next_token = samplers_.at(items[i].session).Sample(engine_->logits(row));
      } else {
        (*out)[i].status = engine::StepStatus::kNonFiniteLogits;
      }
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Layout: the sampler's state (a string), then the KV snapshot (kv::EncodeSnapshot).
std::vector<std::byte> EngineBackend::ExportSession(BackendSessionId id) const {
  const auto kv = engine_->ExportSession(engine::SessionId{static_cast<std::uint32_t>(id)});
  const auto sampler = samplers_.find(id);
  if (!kv || sampler == samplers_.end()) return {};
  base::ByteWriter out;
  out.PutString(sampler->second.SaveState());
  kv::EncodeSnapshot(*kv, engine_->kv_layout(), &out);
  return out.Take();
}

realtime::BackendImport EngineBackend::ImportSession(const kv::KvPolicy& policy,
                                                     TokenPos max_context,
                                                     std::span<const std::byte> state) {
  realtime::BackendImport result;
  base::ByteReader in(state);
  std::string sampler_state;
  engine::Sampler sampler(sampling_);
  if (!in.GetString(&sampler_state, kMaxSamplerStateBytes) ||
      !sampler.RestoreState(sampler_state)) {
    result.error = "sampler: the state is not a generator's";
    return result;
  }
  kv::SessionKvSnapshot snapshot;
  if (!kv::DecodeSnapshot(&in, engine_->kv_layout(), &snapshot, &result.error)) return result;
  engine::SessionId sid{};
  std::string error;
  const kv::RestoreResult restored =
      engine_->ImportSession(SessionOptionsFor(policy, max_context), snapshot, &sid, &error);
  result = realtime::ImportOf(restored, static_cast<BackendSessionId>(sid), error);
  if (result.ok()) samplers_.insert_or_assign(result.id, std::move(sampler));
  return result;
}

std::int64_t EngineBackend::resident_blocks(BackendSessionId id) const {
  const kv::SessionKv* kv = engine_->session_kv(engine::SessionId{static_cast<std::uint32_t>(id)});
  return kv == nullptr ? 0 : kv->resident_blocks();
}

}  // namespace metronome::serving
