#include "metronome/model/gguf.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "metronome/base/errors.h"
#include "metronome/base/half.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::model {
namespace {

// The format is little-endian; values are read by memcpy, so only little-endian hosts are served.
static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

constexpr std::uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr std::uint32_t kWriteVersion = 3;
constexpr std::uint64_t kDefaultAlignment = 32;
// general.alignment beyond this is hostile rather than useful (llama.cpp uses 32).
constexpr std::uint64_t kMaxAlignment = 1u << 16;
constexpr std::uint32_t kMaxDims = 4;
// Upper bound on a tensor's element count: far above any real tensor, low enough that byte sizes
// (at most 4 bytes per element) cannot overflow 64 bits.
constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 56;

enum class ValueType : std::uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// Encoded size of a scalar value type; 0 for string/array/unknown.
std::uint64_t ScalarSize(std::uint32_t type) {
  switch (static_cast<ValueType>(type)) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
      return 8;
    case ValueType::kString:
    case ValueType::kArray:
      break;
  }
  return 0;
}

// The types DequantizeToF32 converts and GgufWriter encodes (the others are parsed and sized).
bool IsDequantizable(GgmlType t) { return quant::Traits(t).computable; }

std::string GgmlTypeName(GgmlType t) { return std::string(quant::Name(t)); }

const char* ValueTypeName(const GgufValue& v) {
  switch (v.index()) {
    case 0:
      return "unsigned integer";
    case 1:
      return "signed integer";
    case 2:
      return "float";
    case 3:
      return "bool";
    case 4:
      return "string";
    case 5:
      return "string array";
    case 6:
      return "float array";
    case 7:
      return "integer array";
    default:
      return "unknown";
  }
}

// Bounds-checked cursor over the file. Every failure names the source and what was being read.
class Reader {
 public:
  Reader(std::span<const std::uint8_t> bytes, const std::string& source)
      : bytes_(bytes), source_(source) {}

  [[nodiscard]] std::size_t pos() const { return pos_; }
  [[nodiscard]] std::size_t remaining() const { return bytes_.size() - pos_; }

  [[noreturn]] void Fail(const std::string& problem) const {
    throw LoadError(source_ + ": " + problem);
  }

  template <typename T>
  T Read(const std::string& what) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (remaining() < sizeof(T)) {
      Fail("truncated at offset " + std::to_string(pos_) + " while reading " + what + " (" +
           std::to_string(sizeof(T)) + " bytes needed, " + std::to_string(remaining()) + " left)");
    }
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string ReadString(const std::string& what) {
    const auto len = Read<std::uint64_t>("the length of " + what);
    if (len > remaining()) {
      Fail("string length " + std::to_string(len) + " of " + what + " exceeds the " +
           std::to_string(remaining()) + " bytes left in the file");
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_),
                  static_cast<std::size_t>(len));
    pos_ += static_cast<std::size_t>(len);
    return s;
  }

 private:
  std::span<const std::uint8_t> bytes_;
  const std::string& source_;
  std::size_t pos_ = 0;
};

// Reads one integer scalar of `type` widened to 64 bits; sets `is_signed`.
std::uint64_t ReadIntegerBits(Reader& r, ValueType type, const std::string& what, bool* is_signed) {
  *is_signed = false;
  switch (type) {
    case ValueType::kUint8:
      return r.Read<std::uint8_t>(what);
    case ValueType::kUint16:
      return r.Read<std::uint16_t>(what);
    case ValueType::kUint32:
      return r.Read<std::uint32_t>(what);
    case ValueType::kUint64:
      return r.Read<std::uint64_t>(what);
    default:
      break;
  }
  *is_signed = true;
  std::int64_t v = 0;
  switch (type) {
    case ValueType::kInt8: {
      // Two's complement by hand: avoids sign-extending a plain char by accident.
      const std::int64_t u = r.Read<std::uint8_t>(what);
      v = u >= 128 ? u - 256 : u;
    } break;
    case ValueType::kInt16:
      v = r.Read<std::int16_t>(what);
      break;
    case ValueType::kInt32:
      v = r.Read<std::int32_t>(what);
      break;
    case ValueType::kInt64:
      v = r.Read<std::int64_t>(what);
      break;
    default:
      r.Fail("internal: " + what + " is not an integer type");
  }
  return static_cast<std::uint64_t>(v);
}

bool IsIntegerType(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kUint16:
    case ValueType::kInt16:
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kUint64:
    case ValueType::kInt64:
      return true;
    default:
      return false;
  }
}

bool ReadBool(Reader& r, const std::string& what) {
  const auto b = r.Read<std::uint8_t>(what);
  if (b > 1) {
    r.Fail(what + " is a bool with invalid byte value " + std::to_string(b));
  }
  return b == 1;
}

GgufValue ReadArray(Reader& r, const std::string& key) {
  const std::string what = "metadata key '" + key + "'";
  const auto elem_raw = r.Read<std::uint32_t>("the element type of " + what);
  const auto elem = static_cast<ValueType>(elem_raw);
  const auto count = r.Read<std::uint64_t>("the element count of " + what);
  if (elem == ValueType::kArray) {
    r.Fail(what + " is a nested array, which is not supported");
  }
  std::uint64_t min_elem_bytes = ScalarSize(elem_raw);
  if (elem == ValueType::kString) {
    min_elem_bytes = sizeof(std::uint64_t);  // the length prefix
  } else if (min_elem_bytes == 0) {
    r.Fail(what + " is an array of unknown value type " + std::to_string(elem_raw));
  }
  // Bounds every reservation below by what the file could actually hold.
  if (count > r.remaining() / min_elem_bytes) {
    r.Fail(what + " has array count " + std::to_string(count) + ", more than the " +
           std::to_string(r.remaining()) + " bytes left in the file can hold");
  }
  const auto n = static_cast<std::size_t>(count);
  if (elem == ValueType::kString) {
    std::vector<std::string> out;
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) out.push_back(r.ReadString(what));
    return out;
  }
  if (elem == ValueType::kFloat32 || elem == ValueType::kFloat64) {
    std::vector<double> out;
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      out.push_back(elem == ValueType::kFloat32 ? r.Read<float>(what) : r.Read<double>(what));
    }
    return out;
  }
  std::vector<std::int64_t> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (elem == ValueType::kBool) {
      out.push_back(ReadBool(r, what) ? 1 : 0);
      continue;
    }
    bool is_signed = false;
    const std::uint64_t bits = ReadIntegerBits(r, elem, what, &is_signed);
    if (!is_signed && bits > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      r.Fail(what + " has array element " + std::to_string(bits) + " beyond the int64 range");
    }
    out.push_back(static_cast<std::int64_t>(bits));
  }
  return out;
}

GgufValue ReadValue(Reader& r, std::uint32_t type_raw, const std::string& key) {
  const auto type = static_cast<ValueType>(type_raw);
  const std::string what = "metadata key '" + key + "'";
  if (IsIntegerType(type)) {
    bool is_signed = false;
    const std::uint64_t bits = ReadIntegerBits(r, type, what, &is_signed);
    if (is_signed) return static_cast<std::int64_t>(bits);
    return bits;
  }
  switch (type) {
    case ValueType::kFloat32:
      return static_cast<double>(r.Read<float>(what));
    case ValueType::kFloat64:
      return r.Read<double>(what);
    case ValueType::kBool:
      return ReadBool(r, what);
    case ValueType::kString:
      return r.ReadString(what);
    case ValueType::kArray:
      return ReadArray(r, key);
    default:
      break;
  }
  r.Fail(what + " has unknown value type " + std::to_string(type_raw));
}

// --- writer encoding helpers ---

void PutBytes(std::vector<std::uint8_t>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

template <typename T>
void Put(std::vector<std::uint8_t>& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  PutBytes(out, &v, sizeof(T));
}

void PutString(std::vector<std::uint8_t>& out, const std::string& s) {
  Put<std::uint64_t>(out, s.size());
  PutBytes(out, s.data(), s.size());
}

std::vector<std::uint8_t> EncodeKey(const std::string& key, ValueType type) {
  std::vector<std::uint8_t> out;
  PutString(out, key);
  Put<std::uint32_t>(out, static_cast<std::uint32_t>(type));
  return out;
}

// The key of an encoded key/value entry (see EncodeKey).
std::string EncodedKey(const std::vector<std::uint8_t>& entry) {
  std::uint64_t len = 0;
  std::memcpy(&len, entry.data(), sizeof(len));
  return {reinterpret_cast<const char*>(entry.data() + sizeof(len)), static_cast<std::size_t>(len)};
}

// Setting a key twice keeps one entry (the last value) at the first position.
void ReplaceEntry(std::vector<std::vector<std::uint8_t>>& kv, std::vector<std::uint8_t> entry) {
  const std::string key = EncodedKey(entry);
  for (auto& existing : kv) {
    if (EncodedKey(existing) == key) {
      existing = std::move(entry);
      return;
    }
  }
  kv.push_back(std::move(entry));
}

std::uint64_t AlignUp(std::uint64_t n, std::uint64_t align) {
  return (n + align - 1) / align * align;
}

// Streams the file to `sink(bytes, n)`. A template over the writer's private tensor list so that
// Serialize() and Write() share it without a second in-memory copy of the tensor data.
template <typename Tensors, typename Sink>
void EmitGguf(const std::vector<std::vector<std::uint8_t>>& kv, const Tensors& tensors,
              Sink&& sink) {
  std::uint64_t alignment = kDefaultAlignment;
  for (const auto& e : kv) {
    if (EncodedKey(e) != "general.alignment") continue;
    std::uint32_t type = 0;
    const std::size_t at = sizeof(std::uint64_t) + EncodedKey(e).size();
    std::memcpy(&type, e.data() + at, sizeof(type));
    std::uint32_t v = 0;
    if (type == static_cast<std::uint32_t>(ValueType::kUint32)) {
      std::memcpy(&v, e.data() + at + sizeof(type), sizeof(v));
    }
    if (v == 0 || !std::has_single_bit(v) || v > kMaxAlignment) {
      throw ConfigError("GgufWriter: general.alignment must be a uint32 power of two <= " +
                        std::to_string(kMaxAlignment));
    }
    alignment = v;
  }

  std::vector<std::uint8_t> head;
  PutBytes(head, kMagic, sizeof(kMagic));
  Put<std::uint32_t>(head, kWriteVersion);
  Put<std::uint64_t>(head, tensors.size());
  Put<std::uint64_t>(head, kv.size());
  for (const auto& e : kv) PutBytes(head, e.data(), e.size());
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    PutString(head, t.name);
    Put<std::uint32_t>(head, static_cast<std::uint32_t>(t.shape.size()));
    for (const std::uint64_t d : t.shape) Put<std::uint64_t>(head, d);
    Put<std::uint32_t>(head, static_cast<std::uint32_t>(t.type));
    Put<std::uint64_t>(head, offset);
    offset = AlignUp(offset + t.bytes, alignment);
  }
  head.resize(static_cast<std::size_t>(AlignUp(head.size(), alignment)), 0);
  sink(head.data(), head.size());
  const std::vector<std::uint8_t> zeros(static_cast<std::size_t>(alignment), 0);
  for (const auto& t : tensors) {
    const auto n = static_cast<std::size_t>(t.bytes);
    if (t.encode) {
      // Freed before the next tensor: at most one streamed tensor's bytes are held.
      std::vector<std::uint8_t> buffer(n);
      t.encode(std::span<std::uint8_t>(buffer));
      sink(buffer.data(), n);
    } else {
      sink(t.data.data(), n);
    }
    const std::size_t pad = static_cast<std::size_t>(AlignUp(t.bytes, alignment)) - n;
    if (pad > 0) sink(zeros.data(), pad);
  }
}

}  // namespace

std::string ShapeString(std::span<const std::uint64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::uint64_t GgufTensorInfo::num_elements() const {
  std::uint64_t n = 1;
  for (const std::uint64_t d : shape) n *= d;
  return n;
}

namespace {

struct Header {
  std::uint32_t version = 0;
  std::uint64_t tensor_count = 0;
  std::uint64_t metadata_count = 0;
};

// The magic, the version and the two counts, each count bounded by the bytes left to hold it.
Header ReadHeader(Reader& r) {
  std::uint8_t magic[4];
  for (auto& m : magic) m = r.Read<std::uint8_t>("the magic");
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%02x %02x %02x %02x", magic[0], magic[1], magic[2], magic[3]);
    r.Fail(std::string("not a GGUF file (magic bytes ") + hex + ", expected 47 47 55 46 \"GGUF\")");
  }
  Header h;
  h.version = r.Read<std::uint32_t>("the version");
  // v1 used 32-bit counts and lengths; v2 and v3 share the layout read here.
  if (h.version != 2 && h.version != 3) {
    r.Fail("unsupported GGUF version " + std::to_string(h.version) + " (supported: 2, 3)");
  }
  h.tensor_count = r.Read<std::uint64_t>("the tensor count");
  h.metadata_count = r.Read<std::uint64_t>("the metadata count");
  // Smallest possible encodings: key length + type + 1 value byte; name length + n_dims + one dim
  // + type + offset.
  constexpr std::uint64_t kMinKvBytes = 8 + 4 + 1;
  constexpr std::uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
  if (h.metadata_count > r.remaining() / kMinKvBytes) {
    r.Fail("metadata count " + std::to_string(h.metadata_count) + " is more than the " +
           std::to_string(r.remaining()) + " bytes left in the file can hold");
  }
  if (h.tensor_count > r.remaining() / kMinTensorInfoBytes) {
    r.Fail("tensor count " + std::to_string(h.tensor_count) + " is more than the " +
           std::to_string(r.remaining()) + " bytes left in the file can hold");
  }
  return h;
}

// `count` key/value pairs; a key given twice is refused.
std::map<std::string, GgufValue> ReadMetadata(Reader& r, std::uint64_t count) {
  std::map<std::string, GgufValue> metadata;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::string key = r.ReadString("metadata key #" + std::to_string(i));
    const auto type = r.Read<std::uint32_t>("the value type of metadata key '" + key + "'");
    GgufValue value = ReadValue(r, type, key);
    if (metadata.contains(key)) {
      r.Fail("duplicate metadata key '" + key + "'");
    }
    metadata.emplace(std::move(key), std::move(value));
  }
  return metadata;
}

// A tensor's shape: 1 to kMaxDims non-zero dimensions of at most kMaxElements elements in all.
void ReadShape(Reader& r, const std::string& what, std::vector<std::uint64_t>* shape) {
  const auto n_dims = r.Read<std::uint32_t>("the dimension count of " + what);
  if (n_dims == 0 || n_dims > kMaxDims) {
    r.Fail(what + " has " + std::to_string(n_dims) + " dimensions (supported: 1 to " +
           std::to_string(kMaxDims) + ")");
  }
  std::uint64_t elements = 1;
  for (std::uint32_t d = 0; d < n_dims; ++d) {
    const auto dim = r.Read<std::uint64_t>("the shape of " + what);
    shape->push_back(dim);
    if (dim == 0) r.Fail(what + " has a zero dimension in shape " + ShapeString(*shape));
    if (dim > kMaxElements / elements) {
      r.Fail(what + " has an absurd shape " + ShapeString(*shape) + " (more than 2^56 elements)");
    }
    elements *= dim;
  }
}

// `count` tensor infos (name, shape, type, offset; no data yet) into *tensors and *index by name.
void ReadTensorInfos(Reader& r, std::uint64_t count, std::vector<GgufTensorInfo>* tensors,
                     std::map<std::string, std::size_t>* index) {
  tensors->reserve(static_cast<std::size_t>(count));
  for (std::uint64_t i = 0; i < count; ++i) {
    GgufTensorInfo t;
    t.name = r.ReadString("the name of tensor #" + std::to_string(i));
    const std::string what = "tensor '" + t.name + "'";
    if (t.name.empty()) r.Fail("tensor #" + std::to_string(i) + " has an empty name");
    if (index->contains(t.name)) r.Fail("duplicate " + what);
    ReadShape(r, what, &t.shape);
    const auto type = r.Read<std::uint32_t>("the type of " + what);
    if (!quant::FindGgmlType(type)) {
      r.Fail(what + " has unknown ggml type id " + std::to_string(type));
    }
    t.type = static_cast<GgmlType>(type);
    t.offset = r.Read<std::uint64_t>("the data offset of " + what);
    index->emplace(t.name, tensors->size());
    tensors->push_back(std::move(t));
  }
}

// general.alignment (a power of two up to kMaxAlignment) when present, else kDefaultAlignment.
std::uint64_t DataAlignment(const Reader& r, const GgufValue* a) {
  if (a == nullptr) return kDefaultAlignment;
  const auto* v = std::get_if<std::uint64_t>(a);
  if (v == nullptr || *v == 0 || !std::has_single_bit(*v) || *v > kMaxAlignment) {
    r.Fail("metadata key 'general.alignment' must be a power of two in [1, " +
           std::to_string(kMaxAlignment) + "]" +
           (v != nullptr ? ", got " + std::to_string(*v)
                         : std::string(", got a ") + ValueTypeName(*a)));
  }
  return *v;
}

// Points every tensor at its bytes in the data section from data_start on: a whole number of
// blocks of its type, at an aligned offset, inside the file.
void PlaceTensorData(const Reader& r, std::span<const std::uint8_t> bytes, std::uint64_t data_start,
                     std::uint64_t alignment, std::vector<GgufTensorInfo>* tensors) {
  const std::uint64_t size = bytes.size();
  const std::uint64_t data_size = data_start <= size ? size - data_start : 0;
  for (auto& t : *tensors) {
    const std::string what = "tensor '" + t.name + "'";
    const auto nbytes = quant::TensorBytes(t.type, t.num_elements());
    if (!nbytes) {
      r.Fail(what + " of type " + GgmlTypeName(t.type) + " has shape " + ShapeString(t.shape) +
             ", which is not a whole number of blocks");
    }
    if (t.offset % alignment != 0) {
      r.Fail(what + " has data offset " + std::to_string(t.offset) +
             ", not a multiple of the alignment " + std::to_string(alignment));
    }
    if (t.offset > data_size || *nbytes > data_size - t.offset) {
      r.Fail(what + " has data at [" + std::to_string(t.offset) + ", +" + std::to_string(*nbytes) +
             ") outside the file's data section of " + std::to_string(data_size) + " bytes");
    }
    t.data = bytes.subspan(static_cast<std::size_t>(data_start + t.offset),
                           static_cast<std::size_t>(*nbytes));
  }
}

// Overlapping tensors would let a small file expand into a huge model (every layer reading the
// same bytes), so the data ranges must be disjoint.
void CheckDisjoint(const Reader& r, const std::vector<GgufTensorInfo>& tensors) {
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors.size());
  for (const auto& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& prev = *by_offset[i - 1];
    if (by_offset[i]->offset < prev.offset + prev.data.size()) {
      r.Fail("tensor '" + by_offset[i]->name + "' has data at offset " +
             std::to_string(by_offset[i]->offset) + " overlapping tensor '" + prev.name + "'");
    }
  }
}

}  // namespace

GgufFile::GgufFile(std::span<const std::uint8_t> bytes, std::string source)
    : source_(std::move(source)) {
  Reader r(bytes, source_);
  const Header header = ReadHeader(r);
  version_ = header.version;
  metadata_ = ReadMetadata(r, header.metadata_count);
  ReadTensorInfos(r, header.tensor_count, &tensors_, &tensor_index_);
  const std::uint64_t alignment = DataAlignment(r, Find("general.alignment"));
  // The data section starts at the first aligned offset after the tensor infos.
  PlaceTensorData(r, bytes, AlignUp(r.pos(), alignment), alignment, &tensors_);
  CheckDisjoint(r, tensors_);
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<std::int64_t> GgufFile::GetInt(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* u = std::get_if<std::uint64_t>(v)) {
    if (*u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw LoadError(source_ + ": metadata key '" + key + "' = " + std::to_string(*u) +
                      " is out of range");
    }
    return static_cast<std::int64_t>(*u);
  }
  if (const auto* s = std::get_if<std::int64_t>(v)) return *s;
  throw LoadError(source_ + ": metadata key '" + key + "' is a " + ValueTypeName(*v) +
                  ", expected an integer");
}

std::int64_t GgufFile::RequireInt(const std::string& key) const {
  const auto v = GetInt(key);
  if (!v) throw LoadError(source_ + ": missing metadata key '" + key + "'");
  return *v;
}

std::optional<double> GgufFile::GetFloat(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* d = std::get_if<double>(v)) return *d;
  if (const auto* u = std::get_if<std::uint64_t>(v)) return static_cast<double>(*u);
  if (const auto* s = std::get_if<std::int64_t>(v)) return static_cast<double>(*s);
  throw LoadError(source_ + ": metadata key '" + key + "' is a " + ValueTypeName(*v) +
                  ", expected a number");
}

std::string GgufFile::RequireString(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) throw LoadError(source_ + ": missing metadata key '" + key + "'");
  if (const auto* s = std::get_if<std::string>(v)) return *s;
  throw LoadError(source_ + ": metadata key '" + key + "' is a " + ValueTypeName(*v) +
                  ", expected a string");
}

void DequantizeToF32(GgmlType type, std::span<const std::uint8_t> data, std::uint64_t count,
                     float* out) {
  if (!IsDequantizable(type)) {
    throw LoadError("cannot dequantise ggml type " + GgmlTypeName(type) +
                    " (supported: " + quant::ComputableTypeNames() + ")");
  }
  const auto needed = count <= kMaxElements ? quant::TensorBytes(type, count) : std::nullopt;
  if (!needed || *needed > data.size()) {
    throw LoadError("cannot dequantise " + std::to_string(count) + " " + GgmlTypeName(type) +
                    " elements from " + std::to_string(data.size()) + " bytes");
  }
  quant::DequantizeRow(type, data.data(), static_cast<std::int64_t>(count), out);
}

void GgufWriter::SetUint32(const std::string& key, std::uint32_t v) {
  auto e = EncodeKey(key, ValueType::kUint32);
  Put(e, v);
  ReplaceEntry(kv_, std::move(e));
}

void GgufWriter::SetFloat32(const std::string& key, float v) {
  auto e = EncodeKey(key, ValueType::kFloat32);
  Put(e, v);
  ReplaceEntry(kv_, std::move(e));
}

void GgufWriter::SetBool(const std::string& key, bool v) {
  auto e = EncodeKey(key, ValueType::kBool);
  Put<std::uint8_t>(e, v ? 1 : 0);
  ReplaceEntry(kv_, std::move(e));
}

void GgufWriter::SetString(const std::string& key, const std::string& v) {
  auto e = EncodeKey(key, ValueType::kString);
  PutString(e, v);
  ReplaceEntry(kv_, std::move(e));
}

void GgufWriter::SetStringArray(const std::string& key, const std::vector<std::string>& v) {
  auto e = EncodeKey(key, ValueType::kArray);
  Put(e, static_cast<std::uint32_t>(ValueType::kString));
  Put<std::uint64_t>(e, v.size());
  for (const auto& s : v) PutString(e, s);
  ReplaceEntry(kv_, std::move(e));
}

void GgufWriter::SetFloat32Array(const std::string& key, const std::vector<float>& v) {
  auto e = EncodeKey(key, ValueType::kArray);
  Put(e, static_cast<std::uint32_t>(ValueType::kFloat32));
  Put<std::uint64_t>(e, v.size());
  PutBytes(e, v.data(), v.size() * sizeof(float));
  ReplaceEntry(kv_, std::move(e));
}

void GgufWriter::SetInt32Array(const std::string& key, const std::vector<std::int32_t>& v) {
  auto e = EncodeKey(key, ValueType::kArray);
  Put(e, static_cast<std::uint32_t>(ValueType::kInt32));
  Put<std::uint64_t>(e, v.size());
  PutBytes(e, v.data(), v.size() * sizeof(std::int32_t));
  ReplaceEntry(kv_, std::move(e));
}

namespace {

// The element count of a tensor the writer is given, within the parser's bounds (every dim
// nonzero, the product at most kMaxElements), so that what it writes it can read back.
std::uint64_t WritableElementCount(const std::string& name, std::span<const std::uint64_t> shape) {
  std::uint64_t count = 1;
  for (const std::uint64_t d : shape) {
    if (d == 0 || d > kMaxElements / count) {
      throw ConfigError("GgufWriter: tensor '" + name + "' has invalid shape " +
                        ShapeString(shape));
    }
    count *= d;
  }
  return count;
}

}  // namespace

void GgufWriter::AddTensor(const std::string& name, std::vector<std::uint64_t> shape, GgmlType type,
                           std::span<const float> values) {
  const std::uint64_t count = WritableElementCount(name, shape);
  if (shape.empty() || shape.size() > kMaxDims || count != values.size()) {
    throw ConfigError("GgufWriter: tensor '" + name + "' has shape " + ShapeString(shape) +
                      " but " + std::to_string(values.size()) + " values");
  }
  CheckNewTensor(name);
  if (!IsDequantizable(type)) {
    throw ConfigError("GgufWriter: tensor '" + name + "': cannot encode ggml type " +
                      GgmlTypeName(type) + " (supported: " + quant::ComputableTypeNames() + ")");
  }
  if (shape[0] % quant::Traits(type).block_elems != 0) {
    throw ConfigError("GgufWriter: tensor '" + name + "' of shape " + ShapeString(shape) +
                      " cannot be stored as " + GgmlTypeName(type) + ": rows of " +
                      std::to_string(shape[0]) + " are not whole blocks of " +
                      std::to_string(quant::Traits(type).block_elems));
  }
  const auto nbytes = quant::TensorBytes(type, count);
  std::vector<std::uint8_t> data(static_cast<std::size_t>(nbytes.value_or(0)));
  quant::QuantizeRow(type, values.data(), static_cast<std::int64_t>(count), data.data());
  const std::uint64_t bytes = data.size();
  tensors_.push_back({name, std::move(shape), type, bytes, std::move(data), {}});
}

void GgufWriter::CheckNewTensor(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) throw ConfigError("GgufWriter: duplicate tensor '" + name + "'");
  }
}

void GgufWriter::AddEncodedTensor(const std::string& name, std::vector<std::uint64_t> shape,
                                  GgmlType type, std::span<const std::uint8_t> data) {
  const std::uint64_t count = WritableElementCount(name, shape);
  const auto nbytes = quant::TensorBytes(type, count);
  if (shape.empty() || shape.size() > kMaxDims || !nbytes || *nbytes != data.size()) {
    throw ConfigError("GgufWriter: tensor '" + name + "' of shape " + ShapeString(shape) + " as " +
                      GgmlTypeName(type) + " needs " +
                      (nbytes ? std::to_string(*nbytes) : std::string("whole blocks, not")) +
                      " bytes, got " + std::to_string(data.size()));
  }
  CheckNewTensor(name);
  tensors_.push_back({name, std::move(shape), type, data.size(), {data.begin(), data.end()}, {}});
}

void GgufWriter::AddStreamedTensor(const std::string& name, std::vector<std::uint64_t> shape,
                                   GgmlType type, TensorEncoder encode) {
  const std::uint64_t count = WritableElementCount(name, shape);
  const auto nbytes = quant::TensorBytes(type, count);
  if (shape.empty() || shape.size() > kMaxDims || !nbytes || !encode) {
    throw ConfigError("GgufWriter: streamed tensor '" + name + "' of shape " + ShapeString(shape) +
                      " as " + GgmlTypeName(type) +
                      (encode ? " is not whole blocks" : " has no encoder"));
  }
  CheckNewTensor(name);
  tensors_.push_back({name, std::move(shape), type, *nbytes, {}, std::move(encode)});
}

std::vector<std::uint8_t> GgufWriter::Serialize() const {
  std::vector<std::uint8_t> out;
  EmitGguf(kv_, tensors_,
           [&out](const std::uint8_t* p, std::size_t n) { out.insert(out.end(), p, p + n); });
  return out;
}

void GgufWriter::Write(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    throw LoadError(path + ": cannot open for writing: " + ErrnoMessage(errno));
  }
  bool ok = true;
  try {
    EmitGguf(kv_, tensors_, [&](const std::uint8_t* p, std::size_t n) {
      if (ok && std::fwrite(p, 1, n, f) != n) ok = false;
    });
  } catch (...) {
    std::fclose(f);
    throw;
  }
  const int write_errno = errno;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) {
    throw LoadError(path + ": write failed: " + ErrnoMessage(write_errno));
  }
}

}  // namespace metronome::model
