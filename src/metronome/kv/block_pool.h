// The engine's one fixed pool of KV blocks. A block holds K and V of `block_tokens` consecutive
// tokens of one session for every layer. Running out of blocks is an ordinary result
// (kNoBlock / false), never an exception: callers (the scheduler, admission) act on it.
//
// Memory layout of block b (elements of KvLayout::dtype, from block_data(b)):
//   [layer][K|V][token in block][kv_dim]
// so one layer's keys of one block are block_tokens * kv_dim contiguous elements. Elements are fp32
// or bf16 (half the bytes: twice the tokens per MiB, half the attention memory traffic; values are
// rounded to nearest-even once when written).
//
// Invariants: every block is either free (in free_list_) or owned by exactly one session;
// num_free_blocks() + num_used_blocks() == num_blocks(). Freeing a free block is a bug (MTR_CHECK).
// Thread-safety: not thread-safe; owned by the engine thread. Block *data* may be read by many
// threads during a step while no block is allocated or freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "metronome/base/half.h"
#include "metronome/base/paged_kv.h"
#include "metronome/base/streamed_memory.h"

namespace metronome::kv {

// Plain vocabulary the attention kernels share (base/paged_kv.h); the pool gives them meaning.
using base::BlockId;
using base::kNoBlock;
using base::KvDtype;
// The KV element type unless a caller asks otherwise (engine, CLI, layouts): bf16 halves the
// memory and the attention traffic per token; its quality cost is in docs/performance.md
// ("KV element type"). The one place this default is written.
inline constexpr KvDtype kDefaultKvDtype = KvDtype::kBF16;
[[nodiscard]] const char* ToString(KvDtype d);
// "f32" | "bf16" (ToString's names); nullopt for anything else.
[[nodiscard]] std::optional<KvDtype> ParseKvDtype(std::string_view name);

struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 16;  // B: tokens per block
  KvDtype dtype = kDefaultKvDtype;

  [[nodiscard]] int kv_dim() const { return num_kv_heads * head_dim; }
  [[nodiscard]] std::size_t element_bytes() const { return dtype == KvDtype::kBF16 ? 2 : 4; }
  // Elements of one layer's K (or V) within a block.
  [[nodiscard]] std::size_t plane_elements() const {
    return static_cast<std::size_t>(block_tokens) * static_cast<std::size_t>(kv_dim());
  }
  [[nodiscard]] std::size_t layer_stride_elements() const { return 2 * plane_elements(); }
  [[nodiscard]] std::size_t block_elements() const {
    return layer_stride_elements() * static_cast<std::size_t>(num_layers);
  }
  [[nodiscard]] std::size_t bytes_per_block() const { return block_elements() * element_bytes(); }
  // K and V of one token over all layers.
  [[nodiscard]] std::size_t bytes_per_token() const {
    return bytes_per_block() / static_cast<std::size_t>(block_tokens);
  }
};

struct BlockPoolOptions {
  int num_blocks = 0;
  // Fill a block with NaN when it is freed, so any read of a freed block poisons the result.
  // For tests and debugging; costs a memset per free.
  bool poison_on_free = false;
};

class BlockPool {
 public:
  // Allocates num_blocks * layout.bytes_per_block() bytes up front (64-byte aligned).
  BlockPool(const KvLayout& layout, const BlockPoolOptions& options);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Number of whole blocks that fit in `megabytes` MiB for `layout`.
  static int BlocksForMegabytes(const KvLayout& layout, double megabytes);

  // One free block, or kNoBlock when the pool is exhausted.
  [[nodiscard]] BlockId Allocate() noexcept;
  // All-or-nothing: n blocks into out[0..n), or false (and nothing taken) if fewer are free.
  [[nodiscard]] bool AllocateMany(int n, BlockId* out) noexcept;
  void Free(BlockId block) noexcept;
  // Free() of a block that slid out of a session's window (counted for telemetry).
  void FreeLeftWindow(BlockId block) noexcept {
    Free(block);
    ++blocks_freed_by_window_;
  }

  [[nodiscard]] std::byte* block_data(BlockId b) noexcept {
    return storage_.get() + static_cast<std::size_t>(b) * layout_.bytes_per_block();
  }
  [[nodiscard]] const std::byte* base() const noexcept { return storage_.get(); }

  [[nodiscard]] const KvLayout& layout() const { return layout_; }
  [[nodiscard]] int num_blocks() const { return static_cast<int>(in_use_.size()); }
  [[nodiscard]] int num_free_blocks() const { return static_cast<int>(free_list_.size()); }
  [[nodiscard]] int num_used_blocks() const { return num_blocks() - num_free_blocks(); }
  [[nodiscard]] bool in_use(BlockId b) const { return in_use_[static_cast<std::size_t>(b)] != 0; }
  // Blocks returned by FreeLeftWindow over the pool's life.
  [[nodiscard]] std::int64_t blocks_freed_by_window() const { return blocks_freed_by_window_; }
  [[nodiscard]] std::size_t capacity_bytes() const {
    return layout_.bytes_per_block() * in_use_.size();
  }

 private:
  void Poison(std::byte* data, std::size_t elements) const;

  KvLayout layout_;
  BlockPoolOptions options_;
  base::StreamedBuffer storage_;
  std::int64_t blocks_freed_by_window_ = 0;
  std::vector<BlockId> free_list_;    // LIFO: a just-freed (cache-warm) block is reused first
  std::vector<std::uint8_t> in_use_;  // [num_blocks]: 1 while owned by a session
};

// What admission, telemetry and /v1/stats read about a pool: one snapshot type for the engine's
// pool and the simulator's alike.
struct PoolStats {
  std::int64_t num_blocks = 0;
  std::int64_t free_blocks = 0;
  std::int64_t used_blocks = 0;
  std::int64_t block_tokens = 0;
  std::int64_t bytes_per_block = 0;
  std::int64_t blocks_freed_by_window = 0;  // over the pool's life, closed sessions included
  std::int64_t num_sessions = 0;
};
// Snapshot of `pool` serving `num_sessions` sessions. O(1).
[[nodiscard]] PoolStats PoolStatsOf(const BlockPool& pool, std::int64_t num_sessions);

}  // namespace metronome::kv
