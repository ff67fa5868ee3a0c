#include "metronome/engine/feed.h"

#include <algorithm>
#include <vector>

namespace metronome::engine {

StepStatus Feed(Engine& engine, SessionId session, std::span<const TokenId> tokens,
                int chunk_tokens, bool all_logits, const LogitsCallback& on_logits) {
  std::vector<StepItemResult> results;
  const std::size_t chunk = static_cast<std::size_t>(std::max(1, chunk_tokens));
  for (std::size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const std::size_t n = std::min(chunk, tokens.size() - begin);
    const bool last_chunk = begin + n == tokens.size();
    StepItem item;
    item.session = session;
    item.tokens = tokens.subspan(begin, n);
    item.logits =
        all_logits ? LogitsMode::kAll : (last_chunk ? LogitsMode::kLast : LogitsMode::kNone);
    engine.Step({&item, 1}, &results);
    const StepItemResult& r = results[0];
    if (r.status != StepStatus::kOk) return r.status;
    if (on_logits) {
      const std::size_t first = begin + n - static_cast<std::size_t>(r.num_logits_rows);
      for (int row = 0; row < r.num_logits_rows; ++row) {
        if (!engine.logits_finite(r.first_logits_row + row)) return StepStatus::kNonFiniteLogits;
        on_logits(first + static_cast<std::size_t>(row), engine.logits(r.first_logits_row + row));
      }
    }
  }
  return StepStatus::kOk;
}

}  // namespace metronome::engine
