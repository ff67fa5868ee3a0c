// The model's parameters in the runtime's layout. Every weight matrix is a quant::WeightMatrix in
// the type it is stored in (row-major [out, in]): for GGUF files a view into the memory-mapped
// file wherever the tensor's bytes are aligned for its type, otherwise a copy in the one arena.
// PlaceForKernels then copies the views out of the file into huge-page memory (the backing's
// pages released) and reorders a matrix's bytes into the layout the CPU's kernels read fastest
// (quant/row_layout.h); its type and size stay.
// Norms and biases are fp32 in the arena (converted at load). llama2.c checkpoints and synthetic
// models are fp32 in the arena.
//
// Fused groups: the Q/K/V projections and gate/up are MatrixGroups whose parts' rows, in order,
// form one output ([q | k | v], [gate | up]); kernels::MatMul runs a group as one product
// (activations prepared once, all parts' rows split over the threads in one loop). fp32 models
// have one part each (fused in the arena); GGUF files keep one part per tensor (never
// concatenated), so a mixed-type group (Q4_K_M files put Q6_K on some tensors) needs nothing
// special.
//
// Thread-safety: immutable after loading; shared read-only by all engine threads.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "metronome/base/streamed_memory.h"
#include "metronome/model/model_config.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::model {

// Parts whose rows, in order, are the output columns of one product.
using MatrixGroup = std::vector<quant::WeightMatrix>;

struct LayerWeights {
  float* attn_norm = nullptr;  // [dim]
  // [qkv_dim, dim]: rows [0, q_dim) = Wq, [q_dim, q_dim+kv_dim) = Wk, then Wv. Q/K rows use the
  // pair layout of ModelConfig::rope_style (no permutation is applied by the runtime).
  MatrixGroup wqkv;
  float* bqkv = nullptr;   // [qkv_dim], only when config.has_qkv_bias; else nullptr
  quant::WeightMatrix wo;  // [dim, q_dim]
  // [head_dim] each, only when config.has_qk_norm: RMSNorm weights of every q resp. k head.
  float* q_norm = nullptr;
  float* k_norm = nullptr;
  float* ffn_norm = nullptr;  // [dim]
  // Dense FFN (not config.is_moe(); else empty):
  // [2 * ffn_dim, dim]: rows [0, ffn_dim) = gate (w1), rows [ffn_dim, 2 ffn_dim) = up (w3)
  MatrixGroup w_gate_up;
  quant::WeightMatrix w_down;  // [dim, ffn_dim] (w2)
  // Mixture of experts (config.is_moe()): the router and, per expert e, the same two products as
  // the dense FFN at expert_ffn_dim (views of rows of the file's 3-D tensors, or of the arena).
  quant::WeightMatrix router;                    // [num_experts, dim]
  std::vector<MatrixGroup> expert_gate_up;       // [num_experts] x [2 * expert_ffn_dim, dim]
  std::vector<quant::WeightMatrix> expert_down;  // [num_experts] x [dim, expert_ffn_dim]
};

// Rows [row_begin, row_begin + count) of a matrix, or of a group's concatenated rows, as fp32
// row-major [count, cols] (for export, tests and tools; not for the hot path).
[[nodiscard]] std::vector<float> DequantizeRows(const quant::WeightMatrix& w, int row_begin,
                                                int count);
[[nodiscard]] std::vector<float> DequantizeRows(const MatrixGroup& group, int row_begin, int count);
// Total rows of a group.
[[nodiscard]] int GroupRows(const MatrixGroup& group);

class ModelWeights {
 public:
  // An fp32 model: zeroed, 64-byte-aligned storage for every tensor of `config`, each group fused
  // into one part. With config.tied_embeddings, `output` aliases `token_embedding`.
  explicit ModelWeights(const ModelConfig& config);
  // Empty: a loader sets the fields, with storage from AllocateArena / KeepAlive.
  ModelWeights() = default;

  quant::WeightMatrix token_embedding;  // [vocab, dim]; rows are dequantised when looked up
  std::vector<LayerWeights> layers;
  float* final_norm = nullptr;  // [dim]
  quant::WeightMatrix output;   // [vocab, dim]

  // The fp32 data of a matrix in this model's arena (for loaders writing fp32 weights).
  [[nodiscard]] float* MutableFloats(const quant::WeightMatrix& w);

  // Zeroed, 64-byte-aligned storage of `bytes` (in huge pages where it spans any:
  // base/streamed_memory.h); called at most once.
  [[nodiscard]] std::byte* AllocateArena(std::size_t bytes);
  // Keeps `backing` (the mapped file the views point into) alive as long as the weights.
  void KeepAlive(std::shared_ptr<const void> backing) { backing_ = std::move(backing); }
  // Loaders report the fp32 floats of the norms and biases they placed (for WeightBytes).
  void AddVectorFloats(std::size_t n) { vector_floats_ += n; }
  // How to drop from resident memory the backing's pages of a matrix that has been copied out of
  // it (MappedFile::ReleasePages); unset, they stay. PlaceForKernels copies a matrix about
  // `chunk_bytes` at a time (whole 16-row groups), hands each chunk to `release` once copied, then
  // the whole matrix (the pages two chunks share): the resident peak while placing is the copies
  // plus one chunk, not plus the largest matrix.
  using PageRelease = std::function<void(const std::byte* begin, std::size_t bytes)>;
  static constexpr std::size_t kPlaceChunkBytes = std::size_t{8} << 20;
  void SetPageRelease(PageRelease release, std::size_t chunk_bytes = kPlaceChunkBytes) {
    release_pages_ = std::move(release);
    place_chunk_bytes_ = chunk_bytes;
  }

  // Puts every matrix where the kernels read it fastest: in the row layout `preferred` names for
  // it (kernels::PreferredRowLayout: the one the kernels of this CPU read fastest), and in
  // streamed memory (base/streamed_memory.h: huge pages, which a 4 KiB-paged file mapping is not).
  // The matrices still viewed in the backing are copied (or reordered while copied) into one
  // buffer per call and the file pages they came from released; a matrix in the arena is reordered
  // in place. Same bytes, so WeightBytes is unchanged. Only row-major -> interleaved is a relayout
  // (a choice of row-major for an interleaved matrix is a programming error). Returns the number of
  // matrices relaid out. Call before the weights are shared; a second call moves nothing already
  // placed.
  using RowLayoutChoice = std::function<quant::RowLayout(const quant::WeightMatrix&)>;
  int PlaceForKernels(const RowLayoutChoice& preferred);

  // Bytes of every weight the model computes with (matrices in their stored type, counted once
  // when aliased, plus the fp32 norms and biases): what a forward pass reads.
  [[nodiscard]] std::size_t WeightBytes() const;
  // "12.3 MiB (types: Q4_K x 97, Q6_K x 18)": the bytes and the matrices per type.
  [[nodiscard]] std::string Summary() const;

 private:
  base::StreamedBuffer arena_;
  std::size_t arena_bytes_ = 0;
  std::size_t vector_floats_ = 0;  // norms and biases
  std::shared_ptr<const void> backing_;
  PageRelease release_pages_;
  std::size_t place_chunk_bytes_ = kPlaceChunkBytes;
  // The matrices moved out of backing_: one buffer per PlaceForKernels call that moved any.
  struct Buffer {
    base::StreamedBuffer data;
    std::size_t bytes = 0;
  };
  std::vector<Buffer> placed_;
};

}  // namespace metronome::model
