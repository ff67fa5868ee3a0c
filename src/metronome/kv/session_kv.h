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

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "metronome/base/byte_io.h"
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

// A session's KV as bytes, to move it to another pool of the same layout (another engine, another
// process): its bookkeeping and the raw contents of its resident blocks, in logical order (the
// sink blocks, then the window's), each KvLayout::bytes_per_block() bytes in the pool's element
// type. Restored exactly, it answers every later query as the original would.
struct SessionKvSnapshot {
  TokenPos length = 0;                      // committed tokens
  std::int64_t window_first_block = 0;      // first resident logical block after the sinks
  std::int64_t peak_resident_blocks = 0;    // carried statistics
  std::int64_t blocks_freed_by_window = 0;  // carried statistics
  std::vector<std::byte> blocks;            // resident blocks' contents, logical order
};

// The snapshot as bytes (base/byte_io.h), after the layout it was taken under: the pool's
// layers, KV heads, head size, block size and element type.
void EncodeSnapshot(const SessionKvSnapshot& snapshot, const KvLayout& layout,
                    base::ByteWriter* out);
// EncodeSnapshot's form for a pool of `layout`: false, with *error naming the first field that
// differs from it (e.g. "kv element type bf16, this pool's is f32") or the bytes that are
// missing, or bytes after them (the snapshot ends its bytes). The blocks' count is Restore's
// to check.
[[nodiscard]] bool DecodeSnapshot(base::ByteReader* in, const KvLayout& layout,
                                  SessionKvSnapshot* snapshot, std::string* error);

enum class RestoreResult : std::uint8_t {
  kOk,
  kPoolExhausted,  // not enough free blocks: nothing was taken
  kInvalid,        // the snapshot is not one of a session with this policy and layout
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

  // The session's committed state (nothing may be reserved beyond length()).
  [[nodiscard]] SessionKvSnapshot Snapshot() const;
  // Makes this empty session the snapshot's: all-or-nothing. kInvalid (with *error naming what
  // disagrees) unless the snapshot is what a session of this policy holds at its length: the
  // resident blocks a query at that length needs, no more, in this pool's block size.
  [[nodiscard]] RestoreResult Restore(const SessionKvSnapshot& snapshot, std::string* error);

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
  // The first resident window block once `length` tokens are committed (Commit's freeing rule).
  [[nodiscard]] std::int64_t WindowFirstBlockAt(TokenPos length) const noexcept;

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
