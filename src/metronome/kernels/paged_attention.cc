#include "metronome/kernels/paged_attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "metronome/base/check.h"
#include "metronome/base/enum_names.h"
#include "metronome/base/half.h"
#include "metronome/kernels/cpu_features.h"
#include "metronome/kernels/internal/attention_loop.h"
#include "metronome/kernels/vector_ops.h"

namespace metronome::kernels {

std::size_t AttentionScratchFloats(const AttentionShape& shape, std::int64_t max_visible) {
  // Scores of one query's group, plus the query rotated for rolling sinks: of one group, or of
  // every head when PagedAttentionHeads walks several kv heads together.
  const auto g = static_cast<std::size_t>(shape.group());
  return g * static_cast<std::size_t>(max_visible) + static_cast<std::size_t>(shape.q_dim());
}

const char* ToString(AttentionImpl impl) {
  static constexpr std::array<EnumName<AttentionImpl>, 6> kNames = {
      {{AttentionImpl::kAuto, "auto"},
       {AttentionImpl::kPortable, "portable"},
       {AttentionImpl::kAvx512, "avx512"},
       {AttentionImpl::kAvx2, "avx2"},
       {AttentionImpl::kAvx512Bf16, "avx512-bf16"},
       {AttentionImpl::kAvx512Bf16RoundedQ, "avx512-bf16-rounded-q"}}};
  return NameOf(kNames, impl, "?");
}

namespace {

// Any head dim: the vector_ops kernels, output accumulated in place.
struct GenericOps {
  struct ScoreHead {
    const float* q = nullptr;
    void Begin(const float* qh, int /*hd*/) { q = qh; }
    [[nodiscard]] float Score(const float* k, int hd) const { return Dot(q, k, hd); }
    [[nodiscard]] float Score(const std::uint16_t* k, int hd) const {
      float s = 0.0f;
      for (int i = 0; i < hd; ++i) s += q[i] * Bf16ToFloat(k[i]);
      return s;
    }
  };
  struct OutHead {
    float* out = nullptr;
    void Begin(int /*hd*/) {}
    void Bind(float* o, int hd) {
      out = o;
      std::memset(out, 0, sizeof(float) * static_cast<std::size_t>(hd));
    }
    void Add(float a, const float* v, int hd) { Axpy(a, v, out, hd); }
    void Add(float a, const std::uint16_t* v, int hd) {
      for (int i = 0; i < hd; ++i) out[i] += a * Bf16ToFloat(v[i]);
    }
    void Finish(float* /*out*/, int /*hd*/) const {}
  };
};

// kv_head's queries on `impl`'s per-head operations: kAvx512 or kAvx2 for the head dims
// WithSimdHeadDim lists where the build has them (AttentionImplAvailable says which), else the
// portable ones.
template <typename E>
void AttendKvHead(AttentionImpl impl, const AttentionShape& shape, const PagedKvView& kv,
                  const QueryKeys* queries, int n, const Rope& rope, int layer, int kv_head,
                  const float* q, float* out, std::size_t q_stride, std::size_t out_stride,
                  float* scratch, const RopeAngleRows* sink_angles,
                  const AttentionKeySlice* slice) noexcept {
  const auto attend = [&](auto ops) {
    AttendQueries<decltype(ops), E>(shape, kv, queries, n, rope, layer, kv_head, q, out, q_stride,
                                    out_stride, scratch, sink_angles, slice);
  };
  bool ran = false;
#if defined(__AVX512F__)
  if (impl == AttentionImpl::kAvx512) {
    ran = WithSimdHeadDim(shape.head_dim, [&](auto hd) {
      attend(VecOps<Avx512Vec, decltype(hd)::value / Avx512Vec::kLanes>{});
    });
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (impl == AttentionImpl::kAvx2) {
    ran = WithSimdHeadDim(shape.head_dim, [&](auto hd) {
      attend(VecOps<Avx2Vec, decltype(hd)::value / Avx2Vec::kLanes>{});
    });
  }
#endif
  if (ran) return;
  MTR_CHECK(impl == AttentionImpl::kPortable, "attention implementation not in this build");
  attend(GenericOps{});
}

}  // namespace

bool AttentionImplAvailable(AttentionImpl impl, const AttentionShape& shape,
                            KvDtype dtype) noexcept {
  switch (impl) {
    case AttentionImpl::kAuto:
    case AttentionImpl::kPortable:
      return true;
    case AttentionImpl::kAvx512:
#if defined(__AVX512F__)
      return WithSimdHeadDim(shape.head_dim, [](auto /*hd*/) {});
#else
      return false;
#endif
    case AttentionImpl::kAvx2:
#if defined(__AVX2__) && defined(__FMA__)
      return WithSimdHeadDim(shape.head_dim, [](auto /*hd*/) {});
#else
      return false;
#endif
    case AttentionImpl::kAvx512Bf16:
    case AttentionImpl::kAvx512Bf16RoundedQ:
      return dtype == KvDtype::kBF16 && CpuHasAvx512Bf16() &&
             internal::Bf16DotHeadDim(shape.head_dim);
  }
  return false;
}

AttentionImpl ResolveAttentionImpl(const AttentionShape& shape, KvDtype dtype) noexcept {
  for (const AttentionImpl impl :
       {AttentionImpl::kAvx512Bf16, AttentionImpl::kAvx512, AttentionImpl::kAvx2}) {
    if (AttentionImplAvailable(impl, shape, dtype)) return impl;
  }
  return AttentionImpl::kPortable;
}

namespace {

// Runs `impl` (kAuto resolved, checked available) for queries[0 .. n) and kv heads
// [kv_head, kv_head + kv_heads), or for the single query queries[0] restricted to `slice`.
void Dispatch(AttentionImpl impl, const AttentionShape& shape, const PagedKvView& kv,
              const QueryKeys* queries, int n, const Rope& rope, int layer, int kv_head,
              int kv_heads, const float* q, float* out, std::size_t q_stride,
              std::size_t out_stride, float* scratch, const RopeAngleRows* sink_angles,
              const AttentionKeySlice* slice) noexcept {
  MTR_DCHECK(kv_heads >= 1 && kv_head + kv_heads <= shape.num_kv_heads,
             "kv heads outside the shape");
  if (impl == AttentionImpl::kAuto) {
    impl = ResolveAttentionImpl(shape, kv.dtype);
  } else {
    MTR_CHECK(AttentionImplAvailable(impl, shape, kv.dtype),
              "attention implementation unavailable");
  }
  const bool bf16 = kv.dtype == KvDtype::kBF16;
  switch (impl) {
    case AttentionImpl::kAvx512Bf16:
    case AttentionImpl::kAvx512Bf16RoundedQ:
      (void)internal::PagedAttentionBf16Dot(impl == AttentionImpl::kAvx512Bf16, shape, kv, queries,
                                            n, rope, layer, kv_head, kv_heads, q, out, q_stride,
                                            out_stride, scratch, sink_angles, slice);
      return;
    case AttentionImpl::kAvx512:
    case AttentionImpl::kAvx2:
    case AttentionImpl::kAuto:
    case AttentionImpl::kPortable:
      break;
  }
  for (int g = kv_head; g < kv_head + kv_heads; ++g) {
    AttentionKeySlice head_slice{};
    const AttentionKeySlice* s = nullptr;
    if (slice != nullptr) {
      head_slice = KvHeadSlice(*slice, shape, g - kv_head);
      s = &head_slice;
    }
    if (bf16) {
      AttendKvHead<std::uint16_t>(impl, shape, kv, queries, n, rope, layer, g, q, out, q_stride,
                                  out_stride, scratch, sink_angles, s);
    } else {
      AttendKvHead<float>(impl, shape, kv, queries, n, rope, layer, g, q, out, q_stride, out_stride,
                          scratch, sink_angles, s);
    }
  }
}

}  // namespace

void PagedAttention(const AttentionShape& shape, const PagedKvView& kv,
                    std::span<const QueryKeys> queries, const Rope& rope, int layer, int kv_head,
                    const float* q, float* out, std::size_t q_stride, std::size_t out_stride,
                    float* scratch, AttentionImpl impl, const RopeAngleRows* sink_angles) noexcept {
  Dispatch(impl, shape, kv, queries.data(), static_cast<int>(queries.size()), rope, layer, kv_head,
           1, q, out, q_stride, out_stride, scratch, sink_angles, nullptr);
}

void PagedAttentionHeads(const AttentionShape& shape, const PagedKvView& kv,
                         std::span<const QueryKeys> queries, const Rope& rope, int layer,
                         int kv_head, int kv_heads, const float* q, float* out,
                         std::size_t q_stride, std::size_t out_stride, float* scratch,
                         AttentionImpl impl, const RopeAngleRows* sink_angles) noexcept {
  MTR_CHECK(kv_heads >= 1 && kv_head >= 0 && kv_head + kv_heads <= shape.num_kv_heads,
            "attention kv heads outside the shape");
  Dispatch(impl, shape, kv, queries.data(), static_cast<int>(queries.size()), rope, layer, kv_head,
           kv_heads, q, out, q_stride, out_stride, scratch, sink_angles, nullptr);
}

void PagedAttentionSlice(const AttentionShape& shape, const PagedKvView& kv, const QueryKeys& keys,
                         const Rope& rope, int layer, int kv_head, int kv_heads, const float* q_row,
                         const AttentionKeySlice& slice, float* scratch, AttentionImpl impl,
                         const RopeAngleRows* sink_angles) noexcept {
  MTR_CHECK(kv_heads >= 1 && kv_head >= 0 && kv_head + kv_heads <= shape.num_kv_heads,
            "attention kv heads outside the shape");
  MTR_CHECK(
      0 <= slice.key_begin && slice.key_begin < slice.key_end && slice.key_end <= keys.count(),
      "attention key slice outside the query's visible keys");
  Dispatch(impl, shape, kv, &keys, 1, rope, layer, kv_head, kv_heads, q_row, slice.out, 0, 0,
           scratch, sink_angles, &slice);
}

void MergeAttentionSlices(const AttentionShape& shape, int kv_heads, const float* outs,
                          const float* stats, int count, float* out) noexcept {
  // Every query head merges alone: kv heads side by side are just more heads.
  const int heads = kv_heads * shape.group();
  const int hd = shape.head_dim;
  const auto head_stride = static_cast<std::size_t>(hd);
  const auto slice_stride = static_cast<std::size_t>(heads) * head_stride;
  for (int h = 0; h < heads; ++h) {
    float m = -std::numeric_limits<float>::infinity();
    for (int s = 0; s < count; ++s) m = std::max(m, stats[2 * (s * heads + h)]);
    // Slice s weighs sum_s exp(max_s - m): its share of the whole softmax's denominator.
    float total = 0.0f;
    float* o = out + static_cast<std::size_t>(h) * head_stride;
    std::memset(o, 0, sizeof(float) * head_stride);
    for (int s = 0; s < count; ++s) {
      const float* st = stats + 2 * (s * heads + h);
      const float weight = st[1] * std::exp(st[0] - m);
      total += weight;
      Axpy(weight,
           outs + static_cast<std::size_t>(s) * slice_stride +
               static_cast<std::size_t>(h) * head_stride,
           o, hd);
    }
    const float inv = 1.0f / total;
    for (int i = 0; i < hd; ++i) o[i] *= inv;
  }
}

}  // namespace metronome::kernels
