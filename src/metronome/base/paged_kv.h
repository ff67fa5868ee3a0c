// What the attention kernels read of one session's KV, as plain data: where its blocks lie in the
// pool (PagedKvView) and which keys each query attends to (QueryKeys). The rules that produce them
// live in kv (kv::SessionKv::View, kv::KvPolicy::KeysOf); the kernels only follow them, so they
// depend on no KV policy or bookkeeping.
#pragma once

#include <cstddef>
#include <cstdint>

#include "metronome/base/types.h"

namespace metronome::base {

using BlockId = std::int32_t;
inline constexpr BlockId kNoBlock = -1;

// The element type of the KV pool: fp32, or bf16 (the top half of an fp32).
enum class KvDtype : std::uint8_t { kF32, kBF16 };

// Read-only view of one session's paged KV: maps a logical block index to its storage in the pool
// without copying the block table. Valid until the session is next modified (kv::SessionKv's
// Reserve/Commit/Release).
struct PagedKvView {
  const std::byte* pool_base = nullptr;
  KvDtype dtype = KvDtype::kF32;
  std::size_t element_bytes = 4;
  std::size_t block_elements = 0;         // kv::KvLayout::block_elements()
  std::size_t layer_stride_elements = 0;  // kv::KvLayout::layer_stride_elements()
  std::size_t plane_elements = 0;         // kv::KvLayout::plane_elements(): offset of V after K
  int block_tokens = 0;
  int kv_dim = 0;
  const BlockId* sink_blocks = nullptr;  // logical blocks [0, num_sink_blocks)
  std::int64_t num_sink_blocks = 0;
  const BlockId* window_blocks = nullptr;  // logical [window_first_block, +num_window_blocks)
  std::int64_t window_first_block = 0;
  std::int64_t num_window_blocks = 0;

  // Keys of `layer` in logical block b: [block_tokens][kv_dim] elements of `dtype` (values follow
  // plane_elements later); nullptr if b is not resident.
  [[nodiscard]] const std::byte* BlockKeys(int layer, std::int64_t b) const noexcept {
    BlockId id = kNoBlock;
    if (b < num_sink_blocks) {
      id = sink_blocks[b];
    } else if (b >= window_first_block && b < window_first_block + num_window_blocks) {
      id = window_blocks[b - window_first_block];
    }
    if (id == kNoBlock) return nullptr;
    return pool_base + (static_cast<std::size_t>(id) * block_elements +
                        static_cast<std::size_t>(layer) * layer_stride_elements) *
                           element_bytes;
  }
};

// The keys one query attends to, as key positions: the pinned sinks [0, sink_end), then the window
// [window_begin, window_end) (empty when window_begin == window_end), in that order: a key's
// index among the query's visible keys counts the sinks first. Under rolling positions the sinks
// are scored against the query rotated by sink_rotation positions (its move to the sinks' frame);
// window scores need no rotation. Built by kv::KvPolicy::KeysOf, the one visibility rule.
struct QueryKeys {
  TokenPos sink_end = 0;
  TokenPos window_begin = 0;
  TokenPos window_end = 0;
  bool rotate_sinks = false;
  TokenPos sink_rotation = 0;  // positions; read only when rotate_sinks

  // The length of the query's scores row.
  [[nodiscard]] std::int64_t count() const { return sink_end + (window_end - window_begin); }
};

}  // namespace metronome::base
