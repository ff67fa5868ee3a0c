// One session's KV cache inside the shared BlockPool: its block table, its KvPolicy and the
// freeing of blocks that fall behind the window.
//
// Logical block b holds tokens [b*B, (b+1)*B). Logical blocks [0, ceil(S/B)) are the sink blocks,
// pinned for the session's life. The others live in a sliding table; a block is freed as soon as
// no future query can see any token in it (block-granular freeing; the attention kernel masks
// token-exactly). Table indices never shift: token j is always in logical block j / B.
//
// Bound (window mode): after Commit, resident blocks <= ceil(S/B) + ceil(W/B) + 1; while a chunk
// of n tokens is reserved, <= ceil(S/B) + ceil((W-1+n)/B) + 1 (KvPolicy::MaxResidentBlocks).
//
// Thread-safety: not thread-safe (engine thread); View() data may be read concurrently during a
// step in which the session is not modified.
#pragma once

#include <cstdint>
#include <vector>

#include "metronome/base/types.h"
#include "metronome/kv/block_pool.h"
#include "metronome/kv/kv_policy.h"

namespace metronome::kv {

using base::PagedKvView;  // what View() hands the attention kernels

enum class ReserveResult : std::uint8_t {
  kOk,
  kPoolExhausted,  // not enough free blocks: nothing was taken, the session is unchanged
  kContextFull,    // the session's context limit (full mode) would be exceeded
};

struct SessionKvStats {
  TokenPos tokens_seen = 0;          // committed tokens
  std::int64_t resident_blocks = 0;  // blocks currently owned
  std::int64_t peak_resident_blocks = 0;
  std::int64_t blocks_freed_by_window = 0;
};

class SessionKv {
 public:
  // `max_tokens`: context limit (Reserve returns kContextFull beyond it). Policy must be valid.
  SessionKv(BlockPool* pool, const KvPolicy& policy, TokenPos max_tokens);
  ~SessionKv();
  SessionKv(const SessionKv&) = delete;
  SessionKv& operator=(const SessionKv&) = delete;

  // Makes tokens [length(), length() + n) writable. All-or-nothing.
  [[nodiscard]] ReserveResult Reserve(int n) noexcept;
  // Appends n reserved tokens (their K/V must have been written) and frees every block that no
  // query at position >= the new length can see.
  void Commit(int n) noexcept;
  // Returns every block to the pool; the session is then empty.
  void Release() noexcept;

  // Stores K and V ([kv_dim] fp32 each, converted to the pool's dtype) of token j for `layer`.
  // j must be reserved and not freed.
  void WriteKv(int layer, TokenPos j, const float* k, const float* v) noexcept;
  // Raw fp32 slots of an fp32 pool (tests and tools that fill K/V directly).
  [[nodiscard]] float* KeySlot(int layer, TokenPos j) noexcept;
  [[nodiscard]] float* ValueSlot(int layer, TokenPos j) noexcept;
  [[nodiscard]] BlockId BlockOf(TokenPos j) const noexcept;  // kNoBlock if freed or not reserved

  [[nodiscard]] PagedKvView View() const noexcept;
  [[nodiscard]] TokenPos length() const { return length_; }
  [[nodiscard]] TokenPos max_tokens() const { return max_tokens_; }
  [[nodiscard]] const KvPolicy& policy() const { return policy_; }
  [[nodiscard]] SessionKvStats stats() const;
  [[nodiscard]] std::int64_t resident_blocks() const {
    return static_cast<std::int64_t>(sink_blocks_.size() + window_blocks_.size() - window_head_);
  }

 private:
  [[nodiscard]] std::byte* SlotBytes(int layer, TokenPos j) noexcept;  // K slot; V is a plane later

  BlockPool* pool_;
  KvPolicy policy_;
  TokenPos max_tokens_;
  int block_tokens_;
  std::int64_t num_sink_blocks_;       // ceil(S/B); 0 in full mode
  TokenPos length_ = 0;                // committed tokens
  std::int64_t allocated_blocks_ = 0;  // logical blocks [0, allocated_blocks_) were allocated
  std::vector<BlockId> sink_blocks_;   // logical blocks [0, min(allocated, num_sink_blocks_))
  // Logical blocks [window_first_block_, allocated_blocks_) are window_blocks_[window_head_ ...].
  std::vector<BlockId> window_blocks_;
  std::size_t window_head_ = 0;
  std::int64_t window_first_block_;
  std::int64_t peak_resident_blocks_ = 0;
  std::int64_t blocks_freed_by_window_ = 0;
};

}  // namespace metronome::kv
