#include "metronome/kv/kv_policy.h"

#include "metronome/base/errors.h"

namespace metronome::kv {
namespace {
std::int64_t CeilDiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
}  // namespace

std::int64_t KvPolicy::MaxResidentBlocks(int block_tokens, int chunk_tokens) const {
  if (mode == KvMode::kFull) return -1;
  const std::int64_t in_flight = chunk_tokens > 0 ? window - 1 + chunk_tokens : window;
  return CeilDiv(sinks, block_tokens) + CeilDiv(in_flight, block_tokens) + 1;
}

void KvPolicy::Validate() const {
  if (mode == KvMode::kFull) return;
  constexpr TokenPos kMaxWindow = TokenPos{1} << 32;
  if (window < 1 || window > kMaxWindow) {
    throw ConfigError("window = " + std::to_string(window) + " must be in [1, " +
                      std::to_string(kMaxWindow) + "]");
  }
  if (sinks < 0 || sinks > kMaxWindow) {
    throw ConfigError("sinks = " + std::to_string(sinks) + " must be in [0, " +
                      std::to_string(kMaxWindow) + "]");
  }
}

std::string KvPolicy::ToString() const {
  if (mode == KvMode::kFull) return "full";
  return "window W=" + std::to_string(window) + " S=" + std::to_string(sinks) +
         (positions == PositionMode::kRolling ? " rolling" : " absolute");
}

}  // namespace metronome::kv
