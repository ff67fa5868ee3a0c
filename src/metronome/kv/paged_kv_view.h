// Read-only view of one session's paged KV for the attention kernel: maps a logical block index to
// its storage in the pool without copying the block table. Valid until the session is next
// modified (Reserve/Commit/Release).
#pragma once

#include <cstddef>
#include <cstdint>

#include "metronome/kv/block_pool.h"

namespace metronome::kv {

struct PagedKvView {
  const std::byte* pool_base = nullptr;
  KvDtype dtype = KvDtype::kF32;
  std::size_t element_bytes = 4;
  std::size_t block_elements = 0;         // KvLayout::block_elements()
  std::size_t layer_stride_elements = 0;  // KvLayout::layer_stride_elements()
  std::size_t plane_elements = 0;         // KvLayout::plane_elements(): offset of V after K
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

}  // namespace metronome::kv
