#include "metronome/kernels/quant_matmul.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "metronome/base/check.h"
#include "metronome/base/half.h"
#include "metronome/base/thread_pool.h"
#include "metronome/kernels/cpu_features.h"
#include "metronome/kernels/gemm.h"
#include "metronome/kernels/quant_gemv_avx512.h"
#include "metronome/kernels/quant_interleaved_avx512.h"
#include "metronome/kernels/quant_matmul_avx2.h"
#include "metronome/kernels/quant_matmul_avx512.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/row_layout.h"
#include "metronome/quant/unpack.h"

namespace metronome::kernels {
namespace {

using quant::ActQ8Block32;
using quant::BlockQ8_K;
using quant::GgmlType;
using quant::kQk32;
using quant::kQkK;

// ---- scalar kernels ----

float Dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int k = 0; k < n; ++k) s += a[k] * b[k];
  return s;
}

void Store(const RowsKernelArgs& a, int i, int r, float v) {
  float& dst = a.y[static_cast<std::size_t>(i) * static_cast<std::size_t>(a.ldy) + r];
  dst = a.accumulate ? dst + v : v;
}

const float* ActF32(const RowsKernelArgs& a, int i) {
  return reinterpret_cast<const float*>(a.act + static_cast<std::size_t>(i) * a.act_row_bytes);
}

// F32 / F16 / BF16: the weight row widened to fp32 once, then dotted with every activation row.
template <GgmlType kType>
void RowsFloat(const RowsKernelArgs& a, int row_begin, int row_end) {
  const quant::WeightMatrix& w = *a.w;
  thread_local std::vector<float> row;
  row.resize(static_cast<std::size_t>(w.cols));
  for (int r = row_begin; r < row_end; ++r) {
    const float* wr = nullptr;
    if constexpr (kType == GgmlType::kF32) {
      wr = reinterpret_cast<const float*>(w.Row(r));
    } else {
      quant::DequantizeRow(kType, w.Row(r), w.cols, row.data());
      wr = row.data();
    }
    for (int i = 0; i < a.m; ++i) Store(a, i, r, Dot(ActF32(a, i), wr, w.cols));
  }
}

// One weight row's integer quants and per-block scales, unpacked once and reused for every
// activation row.
struct UnpackedRow {
  std::vector<std::int8_t> q;    // [cols]
  std::vector<float> d;          // per block (32-element types) or per super-block (K)
  std::vector<float> m;          // Q4_1/Q5_1: per block min; K-min types: per super-block dmin
  std::vector<std::uint8_t> sc;  // K types: 8 (Q4_K/Q5_K) or 16 (Q6_K) sub-block scales each
  std::vector<std::uint8_t> mn;  // Q4_K/Q5_K: 8 sub-block mins each
  std::vector<std::int8_t> sc6;  // Q6_K: 16 signed scales each
};

// Every scalar integer kernel: each weight row unpacked once (T::Unpack: quants and scales into
// `u`) and dotted with every activation row (T::Accumulate adds block b's terms to the row's sum,
// over T::Act blocks, in the order the per-family loops added them). T is a policy per
// family, called directly (inlined); one thread-local UnpackedRow per instantiation.
template <class T>
void RowsUnpacked(const RowsKernelArgs& a, int row_begin, int row_end) {
  const quant::WeightMatrix& w = *a.w;
  const int nb = w.cols / T::kBlockElems;
  thread_local UnpackedRow u;
  u.q.resize(static_cast<std::size_t>(w.cols));
  u.d.resize(static_cast<std::size_t>(nb));
  u.m.resize(static_cast<std::size_t>(nb));
  u.sc.resize(static_cast<std::size_t>(nb) * 8);
  u.mn.resize(static_cast<std::size_t>(nb) * 8);
  u.sc6.resize(static_cast<std::size_t>(nb) * 16);
  thread_local std::vector<std::byte> canonical;  // row r of an interleaved matrix
  for (int r = row_begin; r < row_end; ++r) {
    const auto* blocks =
        reinterpret_cast<const typename T::Block*>(quant::CanonicalRow(w, r, canonical));
    for (int b = 0; b < nb; ++b) T::Unpack(blocks[b], b, u);
    for (int i = 0; i < a.m; ++i) {
      const auto* act = reinterpret_cast<const typename T::Act*>(
          a.act + static_cast<std::size_t>(i) * a.act_row_bytes);
      float acc = 0.0f;
      for (int b = 0; b < nb; ++b) T::Accumulate(u, b, act[b], acc);
      Store(a, i, r, acc);
    }
  }
}

// What every family policy below names (its weight block, the activation block it is dotted with,
// the elements of a block) and the unpacking they all share.
template <typename B, typename A, int kElems>
struct Family {
  using Block = B;
  using Act = A;
  static constexpr int kBlockElems = kElems;
  // Block b's quants into u.q and its scale d into u.d.
  static void UnpackQuantsAndScale(const Block& blk, int b, UnpackedRow& u) noexcept {
    std::int8_t q[kElems];
    quant::UnpackQuants(blk, q);
    std::memcpy(u.q.data() + static_cast<std::ptrdiff_t>(kElems) * b, q, kElems);
    u.d[static_cast<std::size_t>(b)] = F16ToFloat(blk.d);
  }
};

// sum_l q[l] qa[l] over l in [0, len): the integer dot of one (sub-)block.
inline std::int32_t IntDot(const std::int8_t* q, const std::int8_t* qa, int len) noexcept {
  std::int32_t isum = 0;
  for (int l = 0; l < len; ++l) isum += q[l] * qa[l];
  return isum;
}

// 32-element types: x = d q (+ m). dot = d_w d_a sum(q qa) (+ m_w d_a sum(qa)).
template <typename B, bool kHasMin>
struct Blocks32 : Family<B, ActQ8Block32, kQk32> {
  static void Unpack(const B& blk, int b, UnpackedRow& u) noexcept {
    Blocks32::UnpackQuantsAndScale(blk, b, u);
    if constexpr (kHasMin) u.m[static_cast<std::size_t>(b)] = F16ToFloat(blk.m);
  }
  static void Accumulate(const UnpackedRow& u, int b, const ActQ8Block32& act,
                         float& acc) noexcept {
    const std::int32_t isum = IntDot(u.q.data() + kQk32 * b, act.qs, kQk32);
    const auto bi = static_cast<std::size_t>(b);
    acc += u.d[bi] * act.d * static_cast<float>(isum);
    if constexpr (kHasMin) acc += u.m[bi] * act.d * static_cast<float>(act.sum);
  }
};

// Q4_K / Q5_K: x = d sc[j] q - dmin mn[j] per sub-block j of 32.
// dot = d_a (d_w sum_j sc[j] sum(q qa) - dmin_w sum_j mn[j] (bsums[2j] + bsums[2j+1])).
template <typename B>
struct KMin : Family<B, BlockQ8_K, kQkK> {
  static void Unpack(const B& blk, int b, UnpackedRow& u) noexcept {
    KMin::UnpackQuantsAndScale(blk, b, u);
    std::uint8_t sc[8];
    std::uint8_t mn[8];
    quant::UnpackKScales(blk.scales, sc, mn);
    std::memcpy(u.sc.data() + 8 * b, sc, 8);
    std::memcpy(u.mn.data() + 8 * b, mn, 8);
    u.m[static_cast<std::size_t>(b)] = F16ToFloat(blk.dmin);
  }
  static void Accumulate(const UnpackedRow& u, int b, const BlockQ8_K& act, float& acc) noexcept {
    const std::int8_t* q = u.q.data() + kQkK * b;
    std::int32_t sumi = 0;
    std::int32_t summ = 0;
    for (int j = 0; j < 8; ++j) {
      const std::int32_t isum = IntDot(q + 32 * j, act.qs + 32 * j, 32);
      sumi += u.sc[8 * b + j] * isum;
      summ += u.mn[8 * b + j] * (act.bsums[2 * j] + act.bsums[2 * j + 1]);
    }
    const auto bi = static_cast<std::size_t>(b);
    acc += act.d * (u.d[bi] * static_cast<float>(sumi) - u.m[bi] * static_cast<float>(summ));
  }
};

// Q6_K: x = d sc[k] (q - 32) per sub-block k of 16; dot = d_a d_w sum_k sc[k] sum((q - 32) qa).
struct Q6K : Family<quant::BlockQ6_K, BlockQ8_K, kQkK> {
  static void Unpack(const Block& blk, int b, UnpackedRow& u) noexcept {
    UnpackQuantsAndScale(blk, b, u);
    std::memcpy(u.sc6.data() + 16 * b, blk.scales, 16);
  }
  static void Accumulate(const UnpackedRow& u, int b, const Act& act, float& acc) noexcept {
    const std::int8_t* q = u.q.data() + kQkK * b;
    std::int32_t sumi = 0;
    for (int k = 0; k < 16; ++k) {
      const std::int32_t isum = IntDot(q + 16 * k, act.qs + 16 * k, 16);
      sumi += u.sc6[16 * b + k] * isum;
    }
    acc += act.d * u.d[static_cast<std::size_t>(b)] * static_cast<float>(sumi);
  }
};

// ---- tables ----

constexpr std::size_t kTableSize = 40;  // > every ggml type id
using KernelTable = std::array<QuantKernel, kTableSize>;

std::size_t Index(GgmlType type) { return static_cast<std::size_t>(type); }

KernelTable MakeScalarTable() {
  KernelTable t{};
  // Products of quantised activations hand over to dequant+sgemm from kDequantGemmMinRows rows;
  // the fp32-activation ones (F32, F16, BF16) never do (widening is as cheap as dequantising).
  const auto set = [&t](GgmlType type, RowsKernel k) {
    const bool quantised_x = ActivationFormatFor(type) != ActivationFormat::kF32;
    t[Index(type)] = {k, "scalar", nullptr,
                      quantised_x ? kDequantGemmMinRows : std::numeric_limits<int>::max()};
  };
  set(GgmlType::kF32, RowsFloat<GgmlType::kF32>);
  set(GgmlType::kF16, RowsFloat<GgmlType::kF16>);
  set(GgmlType::kBF16, RowsFloat<GgmlType::kBF16>);
  set(GgmlType::kQ8_0, RowsUnpacked<Blocks32<quant::BlockQ8_0, false>>);
  set(GgmlType::kQ4_0, RowsUnpacked<Blocks32<quant::BlockQ4_0, false>>);
  set(GgmlType::kQ4_1, RowsUnpacked<Blocks32<quant::BlockQ4_1, true>>);
  set(GgmlType::kQ5_0, RowsUnpacked<Blocks32<quant::BlockQ5_0, false>>);
  set(GgmlType::kQ5_1, RowsUnpacked<Blocks32<quant::BlockQ5_1, true>>);
  set(GgmlType::kQ4_K, RowsUnpacked<KMin<quant::BlockQ4_K>>);
  set(GgmlType::kQ5_K, RowsUnpacked<KMin<quant::BlockQ5_K>>);
  set(GgmlType::kQ6_K, RowsUnpacked<Q6K>);
  return t;
}

const KernelTable& ScalarTable() {
  static const KernelTable table = MakeScalarTable();
  return table;
}

// THE SEAM: the kernels this CPU runs. Faster implementations override entries here, once, after
// checking the CPU's features (e.g. `if (__builtin_cpu_supports("avx512vnni")) ...`): AVX2 first,
// then the AVX-512 ones where the CPU has them (BF16 keeps the AVX2 kernel without AVX512_BF16).
KernelTable SelectKernels() {
  KernelTable t = ScalarTable();
  if (CpuHasAvx2Fma()) {
    for (std::size_t i = 0; i < t.size(); ++i) {
      const QuantKernel k = avx2::Kernel(static_cast<GgmlType>(i));
      if (k.rows != nullptr) t[i] = k;
    }
  }
  if (CpuHasAvx512Vnni()) {
    const bool bf16 = CpuHasAvx512Bf16();
    for (std::size_t i = 0; i < t.size(); ++i) {
      const QuantKernel k = avx512::Kernel(static_cast<GgmlType>(i), bf16);
      if (k.rows != nullptr) t[i] = k;
    }
    // The decode kernels, for every type that has one: each is faster than the rows kernel or
    // level at m <= kGemvMaxRows, since it streams W once without the GEMM form's panel
    // (bench/quant_benchmark BM_DecodeKernel). BF16's needs AVX512_BF16 like its rows one.
    for (std::size_t i = 0; i < t.size(); ++i) {
      const auto type = static_cast<GgmlType>(i);
      if (t[i].rows == nullptr || (type == GgmlType::kBF16 && !bf16)) continue;
      t[i].gemv = avx512::GemvKernel(type);
    }
  }
  return t;
}

const KernelTable& ActiveTable() {
  static const KernelTable table = SelectKernels();
  return table;
}

// Which kernels a product runs on: the CPU's (MatMul), the scalar table as a CPU without SIMD
// kernels runs it (MatMulOnScalarKernels), or the scalar kernels alone, never handing a
// product to dequant+sgemm (MatMulRowsScalar, the reference).
enum class KernelSet : std::uint8_t { kActive, kScalar, kScalarReference };

// The kernel MatMul runs for `w`: its type's active kernel, or for an interleaved matrix the
// interleaved kernel (the scalar one, which reads rows through quant::CanonicalRow, on a CPU
// without it).
const QuantKernel& KernelFor(const quant::WeightMatrix& w, KernelSet set) noexcept {
  if (set != KernelSet::kActive) return ScalarKernel(w.type);
  if (w.layout == quant::RowLayout::kRowMajor) return ActiveKernel(w.type);
  static const auto table = [] {
    KernelTable t = ScalarTable();
    if (CpuHasAvx512Vnni()) {
      for (std::size_t i = 0; i < t.size(); ++i) {
        if (const RowsKernel k = avx512::InterleavedKernel(static_cast<GgmlType>(i))) {
          t[i] = {k, "avx512-vnni-x16", k};
        }
      }
    }
    return t;
  }();
  const QuantKernel& k = table[Index(w.type) < kTableSize ? Index(w.type) : 0];
  MTR_CHECK(k.rows != nullptr, "no kernel for this weight type");
  return k;
}

// ---- the one parallel split over output rows ----

constexpr int kRowTile = 32;  // output rows per work item (one 32-row panel of the batched kernels)
// Below this many multiply-adds a product runs on the calling thread (waking the team costs more).
constexpr double kMinParallelMacs = 1 << 17;

// One part of a product: its kernel, its arguments (y already offset to the part's first column).
struct PartWork {
  const QuantKernel* kernel;
  RowsKernelArgs args;
  int rows;
  std::int64_t first_unit;      // cost units of earlier parts
  std::int64_t units_per_tile;  // a row tile's cost (TileCostUnits)
};

// A row tile's cost in the units the split balances: its weight bytes in KiB, once per 4 activation
// rows (the kernels unpack a tile's weights once per register tile of rows). At a few rows a
// tile's time is its bytes streamed, so a part of a heavier type (a Q6_K V beside Q4_K Q and K)
// gets fewer tiles a chunk instead of leaving one thread the heavy tail of the product.
std::int64_t TileCostUnits(const quant::WeightMatrix& w, int m) {
  constexpr std::size_t kUnitBytes = 1024;
  constexpr int kRowsPerPass = 4;
  const std::size_t tile_bytes = w.row_bytes * static_cast<std::size_t>(kRowTile);
  const auto units = static_cast<std::int64_t>((tile_bytes + kUnitBytes - 1) / kUnitBytes);
  return std::max<std::int64_t>(1, units) * ((m + kRowsPerPass - 1) / kRowsPerPass);
}

// Runs every part's row tiles; the only place the output rows are split over threads. The split
// is over cost units (parts[i].first_unit on), so each chunk carries about the same bytes; a tile
// belongs to the chunk its first unit falls in.
void ParallelOverRowTiles(base::ThreadPool& pool, std::span<const PartWork> parts,
                          std::int64_t units, double macs) {
  // A product too small to be worth waking the team is one chunk: the pool runs it inline.
  std::int64_t tiles = 0;
  for (const PartWork& part : parts) tiles += (part.rows + kRowTile - 1) / kRowTile;
  const bool parallel = tiles > 1 && macs >= kMinParallelMacs;
  pool.ParallelFor(units, parallel ? 1 : units, [parts](std::int64_t u0, std::int64_t u1) {
    // Per part, the tiles whose first unit lies in [u0, u1), as one row range: a kernel call has
    // a fixed cost (preparing its activation layout, filling its pipeline), paid once per chunk
    // and part, not per tile.
    for (const PartWork& part : parts) {
      const std::int64_t part_tiles = (part.rows + kRowTile - 1) / kRowTile;
      const std::int64_t part_end = part.first_unit + part_tiles * part.units_per_tile;
      if (part_end <= u0) continue;
      if (part.first_unit >= u1) break;
      const auto first_tile_at = [&](std::int64_t u) {
        const std::int64_t rel = std::max<std::int64_t>(0, u - part.first_unit);
        return std::min(part_tiles, (rel + part.units_per_tile - 1) / part.units_per_tile);
      };
      const std::int64_t t0 = first_tile_at(u0);
      const std::int64_t t1 = first_tile_at(u1);
      if (t0 >= t1) continue;
      const int begin = static_cast<int>(t0) * kRowTile;
      const int end = std::min(static_cast<int>(t1) * kRowTile, part.rows);
      const bool gemv = part.args.m <= kGemvMaxRows && part.kernel->gemv != nullptr;
      (gemv ? part.kernel->gemv : part.kernel->rows)(part.args, begin, end);
    }
  });
}

// ---- prefill: dequantised tiles of W through oneDNN's sgemm ----

// The scalar dequantiser: this path serves CPUs without the AVX-512 kernels.
void DequantizeTile(const quant::WeightMatrix& w, int begin, int count, float* out) noexcept {
  thread_local std::vector<std::byte> canonical;  // a row of an interleaved matrix
  for (int i = 0; i < count; ++i) {
    float* o = out + static_cast<std::size_t>(i) * static_cast<std::size_t>(w.cols);
    quant::DequantizeRow(w.type, quant::CanonicalRow(w, begin + i, canonical), w.cols, o);
  }
}

// One tile of a RowsKernel on fp32 activations (args.act = x): W's rows [row_begin, row_end)
// dequantised, then one sgemm for all m rows. Inside ParallelOverRowTiles oneDNN runs on the
// calling thread alone.
void DequantGemmTile(const RowsKernelArgs& a, int row_begin, int row_end) {
  const quant::WeightMatrix& w = *a.w;
  const int count = row_end - row_begin;
  thread_local std::vector<float> wt;
  thread_local std::vector<float> yt;
  wt.resize(static_cast<std::size_t>(count) * static_cast<std::size_t>(w.cols));
  yt.resize(static_cast<std::size_t>(a.m) * static_cast<std::size_t>(count));
  DequantizeTile(w, row_begin, count, wt.data());
  MTR_DCHECK(a.pool != nullptr, "the dequantised product runs on its caller's pool");
  MatMulTransposedB(*a.pool, reinterpret_cast<const float*>(a.act), a.m, w.cols, wt.data(), count,
                    yt.data(), false);
  for (int i = 0; i < a.m; ++i) {
    float* dst = a.y + static_cast<std::size_t>(i) * static_cast<std::size_t>(a.ldy) + row_begin;
    const float* src = yt.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(count);
    for (int j = 0; j < count; ++j) dst[j] = a.accumulate ? dst[j] + src[j] : src[j];
  }
}

// A chunk's range of rows, one kRowTile tile at a time: the dequantised tile (kRowTile x cols
// floats) stays in L1/L2 for its sgemm, and the thread's scratch stays that small.
void RowsDequantGemm(const RowsKernelArgs& a, int row_begin, int row_end) {
  for (int r = row_begin; r < row_end; r += kRowTile) {
    DequantGemmTile(a, r, std::min(r + kRowTile, row_end));
  }
}

// A prepared activation block's bytes in the arena: rounded up to whole cache lines, so every block
// starts on one.
std::size_t ArenaBlockBytes(std::size_t bytes) noexcept { return (bytes + 63) / 64 * 64; }

// Arguments for one part; the activations for its format are prepared at `arena` (advanced past
// them) unless `prepared` already holds them (per format, for the parts of one product).
RowsKernelArgs MakeArgs(const float* x, int m, const quant::WeightMatrix& w, float* y, int ldy,
                        bool accumulate, std::array<const std::byte*, 3>& prepared,
                        std::byte*& arena) {
  RowsKernelArgs args;
  args.m = m;
  args.w = &w;
  args.y = y;
  args.ldy = ldy;
  args.accumulate = accumulate;
  args.act_row_bytes = ActivationRowBytes(w.type, w.cols);
  const ActivationFormat format = ActivationFormatFor(w.type);
  const std::byte*& act = prepared[static_cast<std::size_t>(format)];
  if (act == nullptr) {
    if (format == ActivationFormat::kF32) {
      act = reinterpret_cast<const std::byte*>(x);
    } else {
      PrepareActivations(w.type, x, m, w.cols, arena);
      act = arena;
      arena += ArenaBlockBytes(args.act_row_bytes * static_cast<std::size_t>(m));
    }
  }
  args.act = act;
  return args;
}

bool IsPackedF32(const quant::WeightMatrix& w) {
  return w.type == GgmlType::kF32 &&
         w.row_bytes == static_cast<std::size_t>(w.cols) * sizeof(float);
}

// What a part of an m-row product runs on: nullptr for oneDNN's sgemm (packed F32), else
// DequantGemmKernel from its kernel's dequant_gemm_min_rows on (a prefill on the scalar kernels;
// never for the reference), else its kernel.
const QuantKernel* PartKernel(const quant::WeightMatrix& w, int m, KernelSet set) {
  if (IsPackedF32(w)) return nullptr;
  const QuantKernel& kernel = KernelFor(w, set);
  if (set != KernelSet::kScalarReference && m >= kernel.dequant_gemm_min_rows) {
    return &DequantGemmKernel();
  }
  return &kernel;
}

// The arena bytes a product's prepared activations take: one block per quantised format its
// integer-kernel parts use.
std::size_t ArenaBytes(const MatMulProduct& product, KernelSet set) {
  std::array<bool, 3> seen{};
  std::size_t bytes = 0;
  for (const auto& w : product.parts) {
    const ActivationFormat format = ActivationFormatFor(w.type);
    const QuantKernel* kernel = PartKernel(w, product.m, set);
    if (kernel == nullptr || kernel == &DequantGemmKernel() || format == ActivationFormat::kF32 ||
        seen[static_cast<std::size_t>(format)]) {
      continue;
    }
    seen[static_cast<std::size_t>(format)] = true;
    bytes += ArenaBlockBytes(ActivationRowBytes(w.type, w.cols) *
                             static_cast<std::size_t>(std::max(product.m, 0)));
  }
  return bytes;
}

// Per-calling-thread storage of the prepared activations (grows to the largest set of products
// seen; no allocation per call after that).
std::byte* ActivationArena(std::size_t bytes) {
  thread_local std::vector<std::byte> arena;
  if (arena.size() < bytes) arena.resize(bytes);
  return arena.data();
}

}  // namespace

ActivationFormat ActivationFormatFor(GgmlType type) noexcept {
  switch (type) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
      return ActivationFormat::kQ8Block32;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return ActivationFormat::kQ8K;
    default:
      return ActivationFormat::kF32;
  }
}

std::size_t ActivationRowBytes(GgmlType type, int cols) noexcept {
  const auto n = static_cast<std::size_t>(cols);
  switch (ActivationFormatFor(type)) {
    case ActivationFormat::kQ8Block32:
      return n / kQk32 * sizeof(ActQ8Block32);
    case ActivationFormat::kQ8K:
      return n / kQkK * sizeof(BlockQ8_K);
    case ActivationFormat::kF32:
      break;
  }
  return n * sizeof(float);
}

void PrepareActivations(GgmlType type, const float* x, int m, int cols, std::byte* out) noexcept {
  // The AVX-512 quantisers equal the scalar ones bit for bit (tests/kernels); chosen once.
  static const bool avx512 = CpuHasAvx512Vnni();
  const auto q8 = avx512 ? avx512::QuantizeActivationsQ8 : quant::QuantizeActivationsQ8;
  const auto q8_k = avx512 ? avx512::QuantizeActivationsQ8_K : quant::QuantizeActivationsQ8_K;
  const std::size_t row_bytes = ActivationRowBytes(type, cols);
  for (int i = 0; i < m; ++i) {
    const float* xi = x + static_cast<std::size_t>(i) * static_cast<std::size_t>(cols);
    std::byte* dst = out + static_cast<std::size_t>(i) * row_bytes;
    switch (ActivationFormatFor(type)) {
      case ActivationFormat::kQ8Block32:
        q8(xi, cols, reinterpret_cast<ActQ8Block32*>(dst));
        break;
      case ActivationFormat::kQ8K:
        q8_k(xi, cols, reinterpret_cast<BlockQ8_K*>(dst));
        break;
      case ActivationFormat::kF32:
        std::memcpy(dst, xi, row_bytes);
        break;
    }
  }
}

const QuantKernel& ScalarKernel(GgmlType type) noexcept {
  const QuantKernel& k = ScalarTable()[Index(type) < kTableSize ? Index(type) : 0];
  MTR_CHECK(k.rows != nullptr, "no kernel for this weight type");
  return k;
}

const QuantKernel& DequantGemmKernel() noexcept {
  static const QuantKernel kernel{RowsDequantGemm, "dequant+sgemm"};
  return kernel;
}

const QuantKernel& ActiveKernel(GgmlType type) noexcept {
  const QuantKernel& k = ActiveTable()[Index(type) < kTableSize ? Index(type) : 0];
  MTR_CHECK(k.rows != nullptr, "no kernel for this weight type");
  return k;
}

quant::RowLayout PreferredRowLayout(const quant::WeightMatrix& w) noexcept {
  const bool packed = w.row_bytes == quant::RowBytes(w.type, w.cols);
  return packed && CpuHasAvx512Vnni() && quant::CanInterleave(w.type, w.rows, w.cols)
             ? quant::RowLayout::kInterleaved16
             : quant::RowLayout::kRowMajor;
}

namespace {

void RunMatMul(base::ThreadPool& pool, std::span<const MatMulProduct> products, KernelSet set) {
  std::size_t arena_bytes = 0;
  for (const MatMulProduct& product : products) arena_bytes += ArenaBytes(product, set);
  std::byte* arena = ActivationArena(arena_bytes);
  thread_local std::vector<PartWork> work;
  work.clear();
  std::int64_t units = 0;
  double macs = 0.0;
  for (const MatMulProduct& product : products) {
    const int m = product.m;
    int ldy = 0;
    for (const auto& w : product.parts) ldy += w.rows;
    if (m <= 0 || ldy <= 0) continue;
    std::array<const std::byte*, 3> prepared{};
    int column = 0;
    for (const auto& w : product.parts) {
      MTR_DCHECK(w.cols == product.parts[0].cols, "MatMul: parts of a product differ in cols");
      MTR_DCHECK(quant::RowBytes(w.type, w.cols) != 0, "MatMul: cols not whole blocks");
      float* y_part = product.y + column;
      column += w.rows;
      const QuantKernel* kernel = PartKernel(w, m, set);
      if (kernel == nullptr) {  // oneDNN
        MatMulTransposedB(pool, product.x, m, w.cols, reinterpret_cast<const float*>(w.data),
                          w.rows, y_part, product.accumulate, ldy);
        continue;
      }
      if (kernel == &DequantGemmKernel()) {
        // Prefill: tiles of W dequantised and multiplied by sgemm on the unquantised x.
        RowsKernelArgs args;
        args.act = reinterpret_cast<const std::byte*>(product.x);
        args.act_row_bytes = static_cast<std::size_t>(w.cols) * sizeof(float);
        args.m = m;
        args.w = &w;
        args.y = y_part;
        args.ldy = ldy;
        args.accumulate = product.accumulate;
        args.pool = &pool;
        work.push_back({kernel, args, w.rows, units, TileCostUnits(w, m)});
      } else {
        work.push_back({kernel,
                        MakeArgs(product.x, m, w, y_part, ldy, product.accumulate, prepared, arena),
                        w.rows, units, TileCostUnits(w, m)});
      }
      units += work.back().units_per_tile * ((w.rows + kRowTile - 1) / kRowTile);
      macs += static_cast<double>(m) * w.rows * w.cols;
    }
  }
  if (!work.empty()) ParallelOverRowTiles(pool, work, units, macs);
}

}  // namespace

void MatMul(base::ThreadPool& pool, std::span<const MatMulProduct> products) noexcept {
  RunMatMul(pool, products, KernelSet::kActive);
}

void MatMulOnScalarKernels(base::ThreadPool& pool,
                           std::span<const MatMulProduct> products) noexcept {
  RunMatMul(pool, products, KernelSet::kScalar);
}

std::string_view MatMulKernelName(const quant::WeightMatrix& w, int m) noexcept {
  const QuantKernel* kernel = PartKernel(w, m, KernelSet::kActive);
  return kernel == nullptr ? "onednn" : kernel->name;
}

void MatMul(base::ThreadPool& pool, const float* x, int m,
            std::span<const quant::WeightMatrix> parts, float* y, bool accumulate) noexcept {
  const MatMulProduct product{x, m, parts, y, accumulate};
  MatMul(pool, std::span(&product, 1));
}

void MatMul(base::ThreadPool& pool, const float* x, int m, const quant::WeightMatrix& w, float* y,
            bool accumulate) noexcept {
  MatMul(pool, x, m, std::span<const quant::WeightMatrix>(&w, 1), y, accumulate);
}

void MatMulRowsScalar(const float* x, int m, const quant::WeightMatrix& w, float* y,
                      bool accumulate, int row_begin, int row_end) noexcept {
  if (m <= 0 || row_begin >= row_end) return;
  std::array<const std::byte*, 3> prepared{};
  std::byte* arena = ActivationArena(
      ArenaBytes({x, m, std::span(&w, 1), y, accumulate}, KernelSet::kScalarReference));
  const RowsKernelArgs args = MakeArgs(x, m, w, y, w.rows, accumulate, prepared, arena);
  ScalarKernel(w.type).rows(args, row_begin, row_end);
}

}  // namespace metronome::kernels
