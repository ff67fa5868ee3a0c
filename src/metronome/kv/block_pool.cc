#include "metronome/kv/block_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "metronome/base/check.h"
#include "metronome/base/errors.h"
#include "metronome/base/streamed_memory.h"

namespace metronome::kv {

const char* ToString(KvDtype d) { return d == KvDtype::kBF16 ? "bf16" : "f32"; }

std::optional<KvDtype> ParseKvDtype(std::string_view name) {
  for (const KvDtype d : {KvDtype::kF32, KvDtype::kBF16}) {
    if (name == ToString(d)) return d;
  }
  return std::nullopt;
}

void BlockPool::Poison(std::byte* data, std::size_t elements) const {
  if (layout_.dtype == KvDtype::kBF16) {
    const std::uint16_t nan = FloatToBf16(std::numeric_limits<float>::quiet_NaN());
    auto* p = reinterpret_cast<std::uint16_t*>(data);
    std::fill_n(p, elements, nan);
  } else {
    std::fill_n(reinterpret_cast<float*>(data), elements, std::numeric_limits<float>::quiet_NaN());
  }
}

BlockPool::BlockPool(const KvLayout& layout, const BlockPoolOptions& options)
    : layout_(layout), options_(options) {
  if (layout.num_layers < 1 || layout.num_kv_heads < 1 || layout.head_dim < 1 ||
      layout.block_tokens < 1 || layout.block_tokens > 4096) {
    throw ConfigError("invalid KV layout (block_tokens = " + std::to_string(layout.block_tokens) +
                      ")");
  }
  if (options.num_blocks < 1) {
    throw ConfigError("kv pool: num_blocks = " + std::to_string(options.num_blocks) +
                      " must be >= 1 (the pool's size holds no whole block)");
  }
  const std::size_t bytes = layout.bytes_per_block() * static_cast<std::size_t>(options.num_blocks);
  // Attention streams the pool's blocks every step: huge pages where the pool spans any.
  storage_ = base::AllocateStreamed(bytes);
  if (storage_ == nullptr) {
    throw ConfigError("kv pool: cannot allocate " + std::to_string(bytes >> 20) + " MiB");
  }
  if (options.poison_on_free) {
    Poison(storage_.get(), layout.block_elements() * static_cast<std::size_t>(options.num_blocks));
  }
  in_use_.assign(static_cast<std::size_t>(options.num_blocks), 0);
  free_list_.reserve(static_cast<std::size_t>(options.num_blocks));
  for (int b = options.num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

int BlockPool::BlocksForMegabytes(const KvLayout& layout, double megabytes) {
  const double blocks = megabytes * 1024.0 * 1024.0 / static_cast<double>(layout.bytes_per_block());
  if (!(blocks >= 0.0)) return 0;
  if (blocks > static_cast<double>(std::numeric_limits<std::int32_t>::max() - 1)) {
    return std::numeric_limits<std::int32_t>::max() - 1;
  }
  return static_cast<int>(blocks);
}

BlockId BlockPool::Allocate() noexcept {
  if (free_list_.empty()) return kNoBlock;
  const BlockId b = free_list_.back();
  free_list_.pop_back();
  in_use_[static_cast<std::size_t>(b)] = 1;
  return b;
}

bool BlockPool::AllocateMany(int n, BlockId* out) noexcept {
  if (n > num_free_blocks()) return false;
  for (int i = 0; i < n; ++i) out[i] = Allocate();
  return true;
}

void BlockPool::Free(BlockId block) noexcept {
  MTR_CHECK(block >= 0 && block < num_blocks(), "freeing a block id outside the pool");
  MTR_CHECK(in_use_[static_cast<std::size_t>(block)] != 0, "double free of a KV block");
  in_use_[static_cast<std::size_t>(block)] = 0;
  if (options_.poison_on_free) {
    Poison(block_data(block), layout_.block_elements());
  }
  free_list_.push_back(block);
}

PoolStats PoolStatsOf(const BlockPool& pool, std::int64_t num_sessions) {
  PoolStats s;
  s.num_blocks = pool.num_blocks();
  s.free_blocks = pool.num_free_blocks();
  s.used_blocks = pool.num_used_blocks();
  s.block_tokens = pool.layout().block_tokens;
  s.bytes_per_block = static_cast<std::int64_t>(pool.layout().bytes_per_block());
  s.blocks_freed_by_window = pool.blocks_freed_by_window();
  s.num_sessions = num_sessions;
  return s;
}

}  // namespace metronome::kv
