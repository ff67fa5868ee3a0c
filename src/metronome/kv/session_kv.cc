#include "metronome/kv/session_kv.h"

#include <algorithm>
#include <cstring>

#include "metronome/base/check.h"

namespace metronome::kv {
namespace {
std::int64_t CeilDiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
}  // namespace

SessionKv::SessionKv(BlockPool* pool, const KvPolicy& policy, TokenPos max_tokens)
    : pool_(pool),
      policy_(policy),
      max_tokens_(max_tokens),
      block_tokens_(pool->layout().block_tokens),
      num_sink_blocks_(CeilDiv(policy.effective_sinks(), pool->layout().block_tokens)),
      window_first_block_(num_sink_blocks_) {
  sink_blocks_.reserve(static_cast<std::size_t>(num_sink_blocks_));
}

SessionKv::~SessionKv() { Release(); }

ReserveResult SessionKv::Reserve(int n) noexcept {
  MTR_DCHECK(n >= 0, "negative reservation");
  if (length_ + n > max_tokens_) return ReserveResult::kContextFull;
  const std::int64_t needed = CeilDiv(length_ + n, block_tokens_) - allocated_blocks_;
  if (needed <= 0) return ReserveResult::kOk;
  if (needed > pool_->num_free_blocks()) return ReserveResult::kPoolExhausted;
  for (std::int64_t i = 0; i < needed; ++i) {
    const BlockId b = pool_->Allocate();
    MTR_DCHECK(b != kNoBlock, "pool ran out after the free-count check");
    if (allocated_blocks_ < num_sink_blocks_) {
      sink_blocks_.push_back(b);
    } else {
      window_blocks_.push_back(b);
    }
    ++allocated_blocks_;
  }
  peak_resident_blocks_ = std::max(peak_resident_blocks_, resident_blocks());
  return ReserveResult::kOk;
}

void SessionKv::Commit(int n) noexcept {
  MTR_DCHECK(length_ + n <= allocated_blocks_ * block_tokens_, "commit beyond the reservation");
  length_ += n;
  if (policy_.mode != KvMode::kWindow) return;
  // The next query is at p = length_; token j (>= S) stays visible to it and every later query
  // iff j > p - W. Logical block b is dead iff its last token (b+1)B - 1 <= p - W.
  const TokenPos first_visible = length_ - policy_.window + 1;
  const std::int64_t dead_limit = first_visible > 0 ? first_visible / block_tokens_ : 0;
  while (window_first_block_ < dead_limit && window_head_ < window_blocks_.size()) {
    pool_->FreeLeftWindow(window_blocks_[window_head_]);
    ++window_head_;
    ++window_first_block_;
    ++blocks_freed_by_window_;
  }
  // Keep the table O(W/B): drop the freed prefix once it dominates.
  if (window_head_ > 32 && window_head_ * 2 > window_blocks_.size()) {
    window_blocks_.erase(window_blocks_.begin(),
                         window_blocks_.begin() + static_cast<std::ptrdiff_t>(window_head_));
    window_head_ = 0;
  }
  MTR_DCHECK(resident_blocks() <= policy_.MaxResidentBlocks(block_tokens_),
             "resident blocks exceed the window bound");
}

void SessionKv::Release() noexcept {
  for (const BlockId b : sink_blocks_) pool_->Free(b);
  for (std::size_t i = window_head_; i < window_blocks_.size(); ++i) pool_->Free(window_blocks_[i]);
  sink_blocks_.clear();
  window_blocks_.clear();
  window_head_ = 0;
  window_first_block_ = num_sink_blocks_;
  allocated_blocks_ = 0;
  length_ = 0;
}

BlockId SessionKv::BlockOf(TokenPos j) const noexcept {
  const std::int64_t b = j / block_tokens_;
  if (j < 0 || b >= allocated_blocks_) return kNoBlock;
  if (b < num_sink_blocks_) return sink_blocks_[static_cast<std::size_t>(b)];
  if (b < window_first_block_) return kNoBlock;
  return window_blocks_[window_head_ + static_cast<std::size_t>(b - window_first_block_)];
}

std::byte* SessionKv::SlotBytes(int layer, TokenPos j) noexcept {
  const BlockId b = BlockOf(j);
  MTR_DCHECK(b != kNoBlock, "token slot is not resident");
  const KvLayout& l = pool_->layout();
  const std::size_t element =
      static_cast<std::size_t>(layer) * l.layer_stride_elements() +
      static_cast<std::size_t>(j % block_tokens_) * static_cast<std::size_t>(l.kv_dim());
  return pool_->block_data(b) + element * l.element_bytes();
}

void SessionKv::WriteKv(int layer, TokenPos j, const float* k, const float* v) noexcept {
  const KvLayout& l = pool_->layout();
  std::byte* ks = SlotBytes(layer, j);
  std::byte* vs = ks + l.plane_elements() * l.element_bytes();
  const auto n = static_cast<std::size_t>(l.kv_dim());
  if (l.dtype == KvDtype::kF32) {
    std::memcpy(ks, k, n * sizeof(float));
    std::memcpy(vs, v, n * sizeof(float));
    return;
  }
  auto* kh = reinterpret_cast<std::uint16_t*>(ks);
  auto* vh = reinterpret_cast<std::uint16_t*>(vs);
  for (std::size_t i = 0; i < n; ++i) {
    kh[i] = FloatToBf16(k[i]);
    vh[i] = FloatToBf16(v[i]);
  }
}

float* SessionKv::KeySlot(int layer, TokenPos j) noexcept {
  MTR_DCHECK(pool_->layout().dtype == KvDtype::kF32, "raw fp32 slot of a bf16 pool");
  return reinterpret_cast<float*>(SlotBytes(layer, j));
}

float* SessionKv::ValueSlot(int layer, TokenPos j) noexcept {
  return KeySlot(layer, j) + pool_->layout().plane_elements();
}

PagedKvView SessionKv::View() const noexcept {
  const KvLayout& l = pool_->layout();
  PagedKvView v;
  v.pool_base = pool_->base();
  v.dtype = l.dtype;
  v.element_bytes = l.element_bytes();
  v.block_elements = l.block_elements();
  v.layer_stride_elements = l.layer_stride_elements();
  v.plane_elements = l.plane_elements();
  v.block_tokens = block_tokens_;
  v.kv_dim = l.kv_dim();
  v.sink_blocks = sink_blocks_.data();
  v.num_sink_blocks = static_cast<std::int64_t>(sink_blocks_.size());
  v.window_blocks = window_blocks_.data() + window_head_;
  v.window_first_block = window_first_block_;
  v.num_window_blocks = static_cast<std::int64_t>(window_blocks_.size() - window_head_);
  return v;
}

SessionKvStats SessionKv::stats() const {
  SessionKvStats s;
  s.tokens_seen = length_;
  s.resident_blocks = resident_blocks();
  s.peak_resident_blocks = peak_resident_blocks_;
  s.blocks_freed_by_window = blocks_freed_by_window_;
  return s;
}

}  // namespace metronome::kv
