#include "metronome/kernels/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "metronome/base/check.h"
#include "metronome/kernels/vector_ops.h"

namespace metronome::kernels {
namespace {

// One contiguous run of visible keys [begin, end).
struct KeyRange {
  TokenPos begin;
  TokenPos end;
  bool sinks;  // the pinned range [0, S)
};

// The (at most two) visible ranges for query p: sinks [0, min(S, p+1)) and the window
// [max(S, p-W+1), p]. In full mode S = 0 and W is "infinite", so only [0, p] remains.
int VisibleRanges(const kv::KvPolicy& policy, TokenPos p, KeyRange out[2]) {
  const TokenPos s = policy.effective_sinks();
  const TokenPos w = policy.effective_window();
  int n = 0;
  const TokenPos sink_end = std::min(s, p + 1);
  if (sink_end > 0) out[n++] = {0, sink_end, true};
  const TokenPos win_begin = std::max(s, p - w + 1);
  if (win_begin <= p) out[n++] = {win_begin, p + 1, false};
  return n;
}

}  // namespace

std::size_t AttentionScratchFloats(const AttentionShape& shape, std::int64_t max_visible) {
  const auto g = static_cast<std::size_t>(shape.group());
  return g * static_cast<std::size_t>(max_visible) + g * static_cast<std::size_t>(shape.head_dim);
}

std::int64_t VisibleKeys(const kv::KvPolicy& policy, TokenPos p) {
  KeyRange r[2];
  const int n = VisibleRanges(policy, p, r);
  std::int64_t total = 0;
  for (int i = 0; i < n; ++i) total += r[i].end - r[i].begin;
  return total;
}

void PagedAttention(const AttentionShape& shape, const kv::PagedKvView& kv,
                    const kv::KvPolicy& policy, const Rope& rope, int layer, int kv_head,
                    TokenPos pos0, int n, const float* q, float* out, std::size_t q_stride,
                    std::size_t out_stride, float* scratch) noexcept {
  const int hd = shape.head_dim;
  const int group = shape.group();
  const int bt = kv.block_tokens;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t head_off = static_cast<std::size_t>(kv_head) * static_cast<std::size_t>(hd);

  for (int i = 0; i < n; ++i) {
    const TokenPos p = pos0 + i;
    KeyRange ranges[2];
    const int num_ranges = VisibleRanges(policy, p, ranges);
    std::int64_t visible = 0;
    for (int r = 0; r < num_ranges; ++r) visible += ranges[r].end - ranges[r].begin;
    MTR_DCHECK(visible >= 1, "a query always sees itself");

    const float* q_row = q + static_cast<std::size_t>(i) * q_stride +
                         static_cast<std::size_t>(kv_head * group) * static_cast<std::size_t>(hd);
    float* out_row = out + static_cast<std::size_t>(i) * out_stride +
                     static_cast<std::size_t>(kv_head * group) * static_cast<std::size_t>(hd);
    float* scores = scratch;  // [group][visible]
    float* sink_q = scratch + static_cast<std::size_t>(group) * static_cast<std::size_t>(visible);

    // Rolling positions: sinks are scored against the query moved to S + W - 1.
    const bool rolling = policy.RollingGap(p);
    if (rolling) {
      std::memcpy(sink_q, q_row, sizeof(float) * static_cast<std::size_t>(group * hd));
      rope.Rotate(sink_q, group, policy.sinks + policy.window - 1 - p);
    }

    // Pass 1: scores, one block at a time so each key is loaded once for the whole group.
    std::int64_t col = 0;
    for (int r = 0; r < num_ranges; ++r) {
      const bool is_sink_range = rolling && ranges[r].sinks;
      const float* qg = is_sink_range ? sink_q : q_row;
      for (TokenPos j = ranges[r].begin; j < ranges[r].end;) {
        const std::int64_t b = j / bt;
        const float* keys = kv.BlockKeys(layer, b);
        MTR_DCHECK(keys != nullptr, "visible key in a freed block");
        const TokenPos block_end = std::min<TokenPos>((b + 1) * bt, ranges[r].end);
        for (; j < block_end; ++j, ++col) {
          const float* k = keys + static_cast<std::size_t>(j % bt) * kv.kv_dim + head_off;
          for (int h = 0; h < group; ++h) {
            scores[h * visible + col] = Dot(qg + static_cast<std::ptrdiff_t>(h) * hd, k, hd) * scale;
          }
        }
      }
    }
    for (int h = 0; h < group; ++h) Softmax(scores + h * visible, static_cast<int>(visible));

    // Pass 2: weighted sum of values.
    for (int h = 0; h < group; ++h) std::memset(out_row + h * hd, 0, sizeof(float) * hd);
    col = 0;
    for (int r = 0; r < num_ranges; ++r) {
      for (TokenPos j = ranges[r].begin; j < ranges[r].end;) {
        const std::int64_t b = j / bt;
        const float* values = kv.BlockKeys(layer, b) + kv.plane_floats;
        const TokenPos block_end = std::min<TokenPos>((b + 1) * bt, ranges[r].end);
        for (; j < block_end; ++j, ++col) {
          const float* v = values + static_cast<std::size_t>(j % bt) * kv.kv_dim + head_off;
          for (int h = 0; h < group; ++h) {
            Axpy(scores[h * visible + col], v, out_row + static_cast<std::ptrdiff_t>(h) * hd, hd);
          }
        }
      }
    }
  }
}

}  // namespace metronome::kernels
