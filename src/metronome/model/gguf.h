// GGUF v3 (the llama.cpp file format): a bounds-checked parser over a byte span (normally a
// MappedFile) and a writer. The parser never trusts a count, a length, an offset or a shape: every
// read is checked against the span, every allocation is bounded by what the remaining bytes could
// possibly hold, and every failure is a LoadError naming the source and the problem.
//
// Thread-safety: a parsed GgufFile is immutable; it borrows the bytes, which must outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "metronome/quant/ggml_type.h"

namespace metronome::model {

// Every ggml tensor type (quant/ggml_type.h); the parser accepts any id ggml defines.
using GgmlType = quant::GgmlType;

// A tensor shape as messages and `metronome info` print it, in the order given: "[4096, 32000]".
[[nodiscard]] std::string ShapeString(std::span<const std::uint64_t> shape);

struct GgufTensorInfo {
  std::string name;
  std::vector<std::uint64_t> shape;  // ggml order: shape[0] is the innermost (contiguous) dim
  GgmlType type = GgmlType::kF32;
  std::uint64_t offset = 0;            // relative to the data section, as stored
  std::span<const std::uint8_t> data;  // validated to lie inside the file

  [[nodiscard]] std::uint64_t num_elements() const;
};

// A metadata value. Arrays of strings/numbers are kept as vectors (bounded by the file size).
using GgufValue =
    std::variant<std::uint64_t, std::int64_t, double, bool, std::string, std::vector<std::string>,
                 std::vector<double>, std::vector<std::int64_t>>;

class GgufFile {
 public:
  // Parses header, metadata and tensor infos. `source` names the file in error messages.
  GgufFile(std::span<const std::uint8_t> bytes, std::string source);

  [[nodiscard]] const std::string& source() const { return source_; }
  [[nodiscard]] std::uint32_t version() const { return version_; }
  [[nodiscard]] const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  [[nodiscard]] const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  [[nodiscard]] const GgufValue* Find(const std::string& key) const;
  [[nodiscard]] const GgufTensorInfo* FindTensor(const std::string& name) const;

  // Typed metadata accessors; throw LoadError naming the key when it is missing (Require*) or has
  // the wrong type or an out-of-range value.
  [[nodiscard]] std::int64_t RequireInt(const std::string& key) const;
  [[nodiscard]] std::optional<std::int64_t> GetInt(const std::string& key) const;
  [[nodiscard]] std::optional<double> GetFloat(const std::string& key) const;
  [[nodiscard]] std::string RequireString(const std::string& key) const;

 private:
  std::string source_;
  std::uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t> tensor_index_;
};

// Converts `count` elements of a tensor's data to fp32. Throws LoadError for unsupported types.
void DequantizeToF32(GgmlType type, std::span<const std::uint8_t> data, std::uint64_t count,
                     float* out);

// Builds a GGUF v3 file in memory; Write() stores it. Used by `metronome export-gguf` and by
// tests that need hostile or unusual files.
class GgufWriter {
 public:
  void SetUint32(const std::string& key, std::uint32_t v);
  void SetFloat32(const std::string& key, float v);
  void SetBool(const std::string& key, bool v);
  void SetString(const std::string& key, const std::string& v);
  void SetStringArray(const std::string& key, const std::vector<std::string>& v);
  void SetFloat32Array(const std::string& key, const std::vector<float>& v);
  void SetInt32Array(const std::string& key, const std::vector<std::int32_t>& v);
  // `shape` in ggml order (innermost first). `values` are fp32 and encoded as `type` (any
  // computable type: quant::QuantizeRow; shape[0] must be whole blocks of it).
  void AddTensor(const std::string& name, std::vector<std::uint64_t> shape, GgmlType type,
                 std::span<const float> values);
  // A tensor already encoded as `type`: `data` must be exactly TensorBytes(type, elements).
  void AddEncodedTensor(const std::string& name, std::vector<std::uint64_t> shape, GgmlType type,
                        std::span<const std::uint8_t> data);

  // A tensor whose bytes are produced while the file is written: `encode` is called once, in file
  // order, with a buffer of exactly TensorBytes(type, elements) bytes to fill. The writer then
  // holds one tensor's encoded bytes at a time, so a file larger than memory can be written.
  using TensorEncoder = std::function<void(std::span<std::uint8_t> out)>;
  void AddStreamedTensor(const std::string& name, std::vector<std::uint64_t> shape, GgmlType type,
                         TensorEncoder encode);

  [[nodiscard]] std::vector<std::uint8_t> Serialize() const;
  // Throws LoadError naming `path` if it cannot be written.
  void Write(const std::string& path) const;

 private:
  std::vector<std::vector<std::uint8_t>> kv_;  // encoded key/value pairs, in insertion order
  struct PendingTensor {
    std::string name;
    std::vector<std::uint64_t> shape;
    GgmlType type;
    std::uint64_t bytes = 0;         // the encoded size: data.size(), or what `encode` writes
    std::vector<std::uint8_t> data;  // empty for a streamed tensor
    TensorEncoder encode;            // set only for a streamed tensor
  };
  void CheckNewTensor(const std::string& name) const;
  std::vector<PendingTensor> tensors_;
};

}  // namespace metronome::model
