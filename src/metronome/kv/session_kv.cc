#include "metronome/kv/session_kv.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

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

std::int64_t SessionKv::WindowFirstBlockAt(TokenPos length) const noexcept {
  if (policy_.mode != KvMode::kWindow) return num_sink_blocks_;
  // The next query is at p = length; token j (>= S) stays visible to it and every later query
  // iff j > p - W. Logical block b is dead iff its last token (b+1)B - 1 <= p - W.
  const TokenPos first_visible = length - policy_.window + 1;
  const std::int64_t dead_limit = first_visible > 0 ? first_visible / block_tokens_ : 0;
  const std::int64_t allocated = CeilDiv(length, block_tokens_);
  return std::max(num_sink_blocks_, std::min(dead_limit, allocated));
}

void SessionKv::Commit(int n) noexcept {
  MTR_DCHECK(length_ + n <= allocated_blocks_ * block_tokens_, "commit beyond the reservation");
  length_ += n;
  if (policy_.mode != KvMode::kWindow) return;
  const std::int64_t dead_limit = WindowFirstBlockAt(length_);
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

void EncodeSnapshot(const SessionKvSnapshot& snapshot, const KvLayout& layout,
                    base::ByteWriter* out) {
  out->Put(static_cast<std::int32_t>(layout.num_layers));
  out->Put(static_cast<std::int32_t>(layout.num_kv_heads));
  out->Put(static_cast<std::int32_t>(layout.head_dim));
  out->Put(static_cast<std::int32_t>(layout.block_tokens));
  out->Put(static_cast<std::uint8_t>(layout.dtype));
  out->Put(static_cast<std::int64_t>(snapshot.length));
  out->Put(snapshot.window_first_block);
  out->Put(snapshot.peak_resident_blocks);
  out->Put(snapshot.blocks_freed_by_window);
  out->Put(static_cast<std::uint64_t>(snapshot.blocks.size()));
  out->PutBytes(snapshot.blocks);
}

bool DecodeSnapshot(base::ByteReader* in, const KvLayout& layout, SessionKvSnapshot* snapshot,
                    std::string* error) {
  std::int32_t layers = 0;
  std::int32_t heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t block_tokens = 0;
  std::uint8_t dtype = 0;
  in->Get(&layers);
  in->Get(&heads);
  in->Get(&head_dim);
  in->Get(&block_tokens);
  in->Get(&dtype);
  if (!in->ok()) {
    *error = "kv: the layout is cut short";
    return false;
  }
  const auto differs = [&](const char* field, std::int64_t theirs, std::int64_t ours) {
    *error = std::string("kv: ") + field + " = " + std::to_string(theirs) + ", this pool's is " +
             std::to_string(ours);
    return false;
  };
  if (layers != layout.num_layers) return differs("layers", layers, layout.num_layers);
  if (heads != layout.num_kv_heads) return differs("kv_heads", heads, layout.num_kv_heads);
  if (head_dim != layout.head_dim) return differs("head_dim", head_dim, layout.head_dim);
  if (block_tokens != layout.block_tokens) {
    return differs("block_tokens", block_tokens, layout.block_tokens);
  }
  if (dtype != static_cast<std::uint8_t>(layout.dtype)) {
    const bool known = dtype <= static_cast<std::uint8_t>(KvDtype::kBF16);
    *error = std::string("kv: element type ") +
             (known ? ToString(static_cast<KvDtype>(dtype)) : std::to_string(dtype).c_str()) +
             ", this pool's is " + ToString(layout.dtype);
    return false;
  }
  std::int64_t length = 0;
  std::uint64_t bytes = 0;
  in->Get(&length);
  in->Get(&snapshot->window_first_block);
  in->Get(&snapshot->peak_resident_blocks);
  in->Get(&snapshot->blocks_freed_by_window);
  in->Get(&bytes);
  if (!in->ok() || bytes > in->remaining()) {
    *error = "kv: the blocks are cut short";
    return false;
  }
  if (bytes < in->remaining()) {
    *error = std::to_string(in->remaining() - bytes) + " bytes after the KV";
    return false;
  }
  snapshot->length = length;
  const auto data = in->GetBytes(static_cast<std::size_t>(bytes));
  snapshot->blocks.assign(data.begin(), data.end());
  return true;
}

SessionKvSnapshot SessionKv::Snapshot() const {
  MTR_CHECK(allocated_blocks_ == CeilDiv(length_, block_tokens_),
            "snapshot of a session with reserved, uncommitted blocks");
  const std::size_t block_bytes = pool_->layout().bytes_per_block();
  SessionKvSnapshot s;
  s.length = length_;
  s.window_first_block = window_first_block_;
  s.peak_resident_blocks = peak_resident_blocks_;
  s.blocks_freed_by_window = blocks_freed_by_window_;
  s.blocks.reserve(static_cast<std::size_t>(resident_blocks()) * block_bytes);
  const auto append = [&](BlockId b) {
    const std::byte* data = pool_->block_data(b);
    s.blocks.insert(s.blocks.end(), data, data + block_bytes);
  };
  for (const BlockId b : sink_blocks_) append(b);
  for (std::size_t i = window_head_; i < window_blocks_.size(); ++i) append(window_blocks_[i]);
  return s;
}

RestoreResult SessionKv::Restore(const SessionKvSnapshot& snapshot, std::string* error) {
  MTR_CHECK(length_ == 0 && allocated_blocks_ == 0, "restore into a session that holds tokens");
  const auto invalid = [&](std::string what) {
    *error = std::move(what);
    return RestoreResult::kInvalid;
  };
  if (snapshot.length < 0 || snapshot.length > max_tokens_) {
    return invalid("length = " + std::to_string(snapshot.length) + " outside [0, " +
                   std::to_string(max_tokens_) + "]");
  }
  const std::int64_t allocated = CeilDiv(snapshot.length, block_tokens_);
  const std::int64_t sinks = std::min(allocated, num_sink_blocks_);
  const std::int64_t first = WindowFirstBlockAt(snapshot.length);
  if (allocated > num_sink_blocks_ && snapshot.window_first_block != first) {
    return invalid("window_first_block = " + std::to_string(snapshot.window_first_block) +
                   ", a session of this policy at length " + std::to_string(snapshot.length) +
                   " keeps blocks from " + std::to_string(first));
  }
  const std::int64_t window = allocated > num_sink_blocks_ ? allocated - first : 0;
  const std::size_t block_bytes = pool_->layout().bytes_per_block();
  const auto resident = static_cast<std::size_t>(sinks + window);
  if (snapshot.blocks.size() != resident * block_bytes) {
    return invalid("blocks hold " + std::to_string(snapshot.blocks.size()) + " bytes, " +
                   std::to_string(resident) + " resident blocks of " + std::to_string(block_bytes) +
                   " bytes expected");
  }
  if (std::cmp_greater(resident, pool_->num_free_blocks())) return RestoreResult::kPoolExhausted;
  const std::byte* src = snapshot.blocks.data();
  const auto take = [&]() {
    const BlockId b = pool_->Allocate();
    MTR_CHECK(b != kNoBlock, "pool ran out after the free-count check");
    std::memcpy(pool_->block_data(b), src, block_bytes);
    src += block_bytes;
    return b;
  };
  for (std::int64_t i = 0; i < sinks; ++i) sink_blocks_.push_back(take());
  for (std::int64_t i = 0; i < window; ++i) window_blocks_.push_back(take());
  window_head_ = 0;
  window_first_block_ = allocated > num_sink_blocks_ ? first : num_sink_blocks_;
  allocated_blocks_ = allocated;
  length_ = snapshot.length;
  peak_resident_blocks_ = std::max(snapshot.peak_resident_blocks, resident_blocks());
  blocks_freed_by_window_ = snapshot.blocks_freed_by_window;
  return RestoreResult::kOk;
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
