#include "metronome/model/weights.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <new>
#include <set>
#include <utility>

#include "metronome/base/check.h"
#include "metronome/base/streamed_memory.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/row_layout.h"

namespace metronome::model {
namespace {

constexpr std::size_t kAlignBytes = 64;  // one cache line, one AVX-512 vector

std::size_t RoundUp(std::size_t n) { return (n + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

template <typename Weights, typename Fn>
void ForEachMatrix(Weights& w, Fn fn) {
  fn(w.token_embedding);
  for (auto& l : w.layers) {
    for (auto& part : l.wqkv) fn(part);
    fn(l.wo);
    for (auto& part : l.w_gate_up) fn(part);
    fn(l.w_down);
    fn(l.router);
    for (auto& group : l.expert_gate_up) {
      for (auto& part : group) fn(part);
    }
    for (auto& down : l.expert_down) fn(down);
  }
  fn(w.output);
}

}  // namespace

std::vector<float> DequantizeRows(const quant::WeightMatrix& w, int row_begin, int count) {
  MTR_CHECK(row_begin >= 0 && count >= 0 && row_begin + count <= w.rows, "rows out of range");
  const auto cols = static_cast<std::size_t>(w.cols);
  std::vector<float> out(static_cast<std::size_t>(count) * cols);
  for (int r = 0; r < count; ++r) {
    quant::DequantizeMatrixRow(w, row_begin + r, out.data() + r * cols);
  }
  return out;
}

std::vector<float> DequantizeRows(const MatrixGroup& group, int row_begin, int count) {
  std::vector<float> out;
  int offset = 0;  // first row of the current part in the group
  for (const auto& part : group) {
    const int lo = std::max(row_begin, offset);
    const int hi = std::min(row_begin + count, offset + part.rows);
    if (lo < hi) {
      const auto rows = DequantizeRows(part, lo - offset, hi - lo);
      out.insert(out.end(), rows.begin(), rows.end());
    }
    offset += part.rows;
  }
  MTR_CHECK(row_begin >= 0 && row_begin + count <= offset, "group rows out of range");
  return out;
}

int GroupRows(const MatrixGroup& group) {
  int rows = 0;
  for (const auto& part : group) rows += part.rows;
  return rows;
}

std::byte* ModelWeights::AllocateArena(std::size_t bytes) {
  MTR_CHECK(arena_ == nullptr, "ModelWeights::AllocateArena called twice");
  const std::size_t size = RoundUp(bytes == 0 ? 1 : bytes);
  base::StreamedBuffer mem = base::AllocateStreamed(size);
  if (mem == nullptr) throw std::bad_alloc();
  std::memset(mem.get(), 0, size);
  arena_ = std::move(mem);
  arena_bytes_ = size;
  return arena_.get();
}

float* ModelWeights::MutableFloats(const quant::WeightMatrix& w) {
  const std::byte* begin = arena_.get();
  MTR_CHECK(w.type == quant::GgmlType::kF32 && begin != nullptr && w.data >= begin &&
                w.data + w.Bytes() <= begin + arena_bytes_,
            "MutableFloats: not an fp32 matrix of this model's arena");
  // The arena is this object's own writable allocation; the view only holds it as const.
  return reinterpret_cast<float*>(arena_.get() + (w.data - begin));
}

ModelWeights::ModelWeights(const ModelConfig& c) {
  const ModelConfig::Extents size = c.extents();

  // Two passes over the same layout: the first sizes the arena, the second hands out pointers.
  std::size_t cursor = 0;
  std::byte* base = nullptr;
  auto take = [&](std::size_t floats) -> float* {
    float* p = base == nullptr ? nullptr : reinterpret_cast<float*>(base + cursor);
    cursor += RoundUp(floats * sizeof(float));
    return p;
  };
  auto matrix = [&](std::size_t rows, std::size_t cols) {
    const float* p = take(rows * cols);
    return quant::MakeWeightMatrix(quant::GgmlType::kF32, static_cast<int>(rows),
                                   static_cast<int>(cols), p);
  };
  for (int pass = 0; pass < 2; ++pass) {
    cursor = 0;
    vector_floats_ = 0;
    layers.assign(static_cast<std::size_t>(c.num_layers), LayerWeights{});
    token_embedding = matrix(size.vocab, size.dim);
    for (auto& l : layers) {
      l.attn_norm = take(size.dim);
      l.wqkv = {matrix(size.qkv, size.dim)};
      l.bqkv = c.has_qkv_bias ? take(size.qkv) : nullptr;
      if (c.has_qk_norm) {
        l.q_norm = take(size.head);
        l.k_norm = take(size.head);
        vector_floats_ += 2 * size.head;
      }
      l.wo = matrix(size.dim, size.q);
      l.ffn_norm = take(size.dim);
      if (c.is_moe()) {
        // All experts' gate|up rows in one matrix, then all their down rows: each expert a slice
        // (taken in the pass that has the storage).
        l.router = matrix(size.experts, size.dim);
        const quant::WeightMatrix gate_up = matrix(size.experts * 2 * size.expert_ffn, size.dim);
        const quant::WeightMatrix down = matrix(size.experts * size.dim, size.expert_ffn);
        l.expert_gate_up.clear();
        l.expert_down.clear();
        for (std::size_t e = 0; base != nullptr && e < size.experts; ++e) {  // sized: pass 1 only
          l.expert_gate_up.push_back({gate_up.RowSlice(static_cast<int>(e * 2 * size.expert_ffn),
                                                       static_cast<int>(2 * size.expert_ffn))});
          l.expert_down.push_back(
              down.RowSlice(static_cast<int>(e * size.dim), static_cast<int>(size.dim)));
        }
      } else {
        l.w_gate_up = {matrix(2 * size.ffn, size.dim)};
        l.w_down = matrix(size.dim, size.ffn);
      }
      vector_floats_ += 2 * size.dim + (c.has_qkv_bias ? size.qkv : 0);
    }
    final_norm = take(size.dim);
    vector_floats_ += size.dim;
    output = c.tied_embeddings ? token_embedding : matrix(size.vocab, size.dim);
    if (pass == 0) base = AllocateArena(cursor);
  }
}

int ModelWeights::PlaceForKernels(const RowLayoutChoice& preferred) {
  // Whether `m` is in memory of this object's own (the arena, an earlier call's buffer): writable,
  // and already streamed memory.
  const auto owned = [&](const quant::WeightMatrix& m) -> std::byte* {
    const auto inside = [&](std::byte* begin, std::size_t bytes) {
      return begin != nullptr && m.data >= begin && m.data + m.Bytes() <= begin + bytes;
    };
    // The buffers are this object's own writable allocations; the views only hold them as const.
    if (inside(arena_.get(), arena_bytes_)) return arena_.get() + (m.data - arena_.get());
    for (const Buffer& b : placed_) {
      if (inside(b.data.get(), b.bytes)) return b.data.get() + (m.data - b.data.get());
    }
    return nullptr;
  };
  // Two passes: the first sizes one buffer for every matrix still viewed in the backing (tied
  // matrices once), the second copies or reorders each into it.
  std::size_t backing_bytes = 0;
  std::set<const std::byte*> sized;
  ForEachMatrix(*this, [&](const quant::WeightMatrix& m) {
    if (m.data == nullptr || owned(m) != nullptr) return;
    if (sized.insert(m.data).second) backing_bytes += RoundUp(m.Bytes());
  });
  std::byte* cursor = nullptr;
  if (backing_bytes > 0) {
    base::StreamedBuffer mem = base::AllocateStreamed(backing_bytes);
    if (mem == nullptr) throw std::bad_alloc();
    placed_.push_back({std::move(mem), backing_bytes});
    cursor = placed_.back().data.get();
  }

  std::map<const std::byte*, quant::WeightMatrix> done;  // old data -> placed (tied matrices)
  int relaid = 0;
  ForEachMatrix(*this, [&](quant::WeightMatrix& m) {
    if (m.data == nullptr) return;
    if (const auto it = done.find(m.data); it != done.end()) {
      m = it->second;
      return;
    }
    const std::byte* old = m.data;
    const quant::RowLayout want = preferred(m);
    MTR_CHECK(want == m.layout || want == quant::RowLayout::kInterleaved16,
              "PlaceForKernels: only row-major matrices are relaid out");
    std::byte* dst = owned(m);
    const bool from_backing = dst == nullptr;
    if (from_backing) {
      dst = cursor;
      cursor += RoundUp(m.Bytes());
    }
    if (want != m.layout && !from_backing) {
      m = quant::InterleaveRows(m, dst);  // in place
      ++relaid;
    } else if (from_backing) {
      // Out of the mapping a chunk of rows at a time, each chunk's file pages released once it is
      // copied (SetPageRelease; a real model's output matrix is hundreds of MiB). Interleaved
      // chunks are whole 16-row groups, each laid out on its own, so they compose to the whole
      // matrix's form.
      const int rows_per_chunk =
          std::max(quant::kInterleaveRows,
                   static_cast<int>(place_chunk_bytes_ / (quant::kInterleaveRows * m.row_bytes)) *
                       quant::kInterleaveRows);
      for (int r = 0; r < m.rows; r += rows_per_chunk) {
        const quant::WeightMatrix chunk = m.RowSlice(r, std::min(rows_per_chunk, m.rows - r));
        std::byte* to = dst + static_cast<std::size_t>(r) * m.row_bytes;
        if (want != m.layout) {
          (void)quant::InterleaveRows(chunk, to);
        } else {
          std::memcpy(to, chunk.data, chunk.Bytes());
        }
        if (release_pages_) release_pages_(chunk.data, chunk.Bytes());
      }
      if (want != m.layout) ++relaid;
      m.data = dst;
      m.layout = want;
    }
    // With the pages the chunks shared at their edges.
    if (from_backing && release_pages_) release_pages_(old, m.Bytes());
    done.emplace(old, m);
  });
  return relaid;
}

std::size_t ModelWeights::WeightBytes() const {
  std::set<const std::byte*> seen;
  std::size_t bytes = vector_floats_ * sizeof(float);
  ForEachMatrix(*this, [&](const quant::WeightMatrix& m) {
    if (m.data != nullptr && seen.insert(m.data).second) bytes += m.Bytes();
  });
  return bytes;
}

std::string ModelWeights::Summary() const {
  std::set<const std::byte*> seen;
  std::map<std::string, int> per_type;
  int interleaved = 0;
  ForEachMatrix(*this, [&](const quant::WeightMatrix& m) {
    if (m.data == nullptr || !seen.insert(m.data).second) return;
    ++per_type[std::string(Name(m.type))];
    interleaved += m.layout == quant::RowLayout::kInterleaved16 ? 1 : 0;
  });
  char mib[32];
  std::snprintf(mib, sizeof(mib), "%.1f MiB", static_cast<double>(WeightBytes()) / (1 << 20));
  std::string s = std::string(mib) + " (types:";
  bool first = true;
  for (const auto& [name, count] : per_type) {
    s += (first ? " " : ", ") + name + " x " + std::to_string(count);
    first = false;
  }
  if (interleaved > 0) s += "; " + std::to_string(interleaved) + " in 16-row interleaved layout";
  return s + ")";
}

}  // namespace metronome::model
