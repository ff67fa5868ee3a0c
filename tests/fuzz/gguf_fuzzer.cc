// libFuzzer target for the GGUF parser, dequantisation, model loader and the load-time row
// relayout (quant/row_layout.h). Any input must either
// load or fail with LoadError/ConfigError; crashes, sanitizer reports, hangs and out-of-memory
// are bugs. Seeds: tests/fuzz/corpus/gguf (written by gguf_test's DISABLED_WriteFuzzSeeds).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/model/gguf.h"
#include "metronome/model/internal/gguf_loader.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/row_layout.h"

namespace {

// Dequantise at most this many elements per tensor: enough to touch every code path.
constexpr std::uint64_t kMaxElements = 4096;

void FuzzParser(std::span<const std::uint8_t> bytes) {
  using metronome::model::GgmlType;
  const metronome::model::GgufFile file(bytes, "fuzz.gguf");
  std::vector<float> out(kMaxElements);
  for (const auto& t : file.tensors()) {
    std::uint64_t n = std::min(t.num_elements(), kMaxElements);
    if (t.type == GgmlType::kQ8_0) n -= n % 32;  // whole blocks only
    metronome::model::DequantizeToF32(t.type, t.data, n, out.data());
  }
  // The typed accessors on every key: each either answers or throws LoadError.
  for (const auto& [key, value] : file.metadata()) {
    try {
      (void)file.GetInt(key);
    } catch (const metronome::LoadError&) {
    }
    try {
      (void)file.GetFloat(key);
    } catch (const metronome::LoadError&) {
    }
  }
}

// The load-time relayout (ModelWeights::PlaceForKernels) for every matrix that has an interleaved
// form (a superset of kernels::PreferredRowLayout's choice, without its CPU check), then rows read
// back through it: the first and last row of the embedding.
void FuzzRowLayouts(metronome::model::ModelWeights& weights) {
  namespace quant = metronome::quant;
  (void)weights.PlaceForKernels([](const quant::WeightMatrix& w) {
    const bool packed = w.row_bytes == quant::RowBytes(w.type, w.cols);
    return packed && quant::CanInterleave(w.type, w.rows, w.cols) ? quant::RowLayout::kInterleaved16
                                                                  : quant::RowLayout::kRowMajor;
  });
  (void)weights.Summary();
  const quant::WeightMatrix& e = weights.token_embedding;
  if (e.data == nullptr || e.rows <= 0) return;
  std::vector<float> row(static_cast<std::size_t>(e.cols));
  quant::DequantizeMatrixRow(e, 0, row.data());
  quant::DequantizeMatrixRow(e, e.rows - 1, row.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  try {
    FuzzParser(bytes);
  } catch (const metronome::LoadError&) {
  }
  try {
    const auto model = metronome::model::internal::LoadGgufModelFromBytes(bytes, "fuzz.gguf");
    if (model.tokenizer != nullptr) {
      (void)model.tokenizer->Encode("Hello, world! 123", true);
    }
    if (model.weights != nullptr) FuzzRowLayouts(*model.weights);
  } catch (const metronome::LoadError&) {
  } catch (const metronome::ConfigError&) {
  }
  return 0;
}
