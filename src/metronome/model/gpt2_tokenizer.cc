// GPT-2 byte-level BPE (GGUF tokenizer.ggml.model = "gpt2": qwen2, Llama 3, SmolLM, GPT-2).
//
// Encode: user-defined tokens are matched literally first (control tokens never are); each stretch
// between them is split by the vocabulary's pre-tokenizer (llama.cpp's patterns for that name,
// implemented by hand below); each pre-token's bytes become the byte-level alphabet's
// single-character tokens, which are then merged by rank (lowest rank first, ties leftmost) from
// vocab.merges (llama-bpe first takes a pre-token that is itself a token whole). Pre-tokens never
// merge with each other, so a pre-token's ids depend only on its own bytes.
//
// Invalid UTF-8 never fails: the pre-tokenizer treats a byte that does not start a valid sequence
// as a one-byte punctuation-like character, and BPE works on bytes anyway.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/model/internal/bpe_merge.h"
#include "metronome/model/internal/gguf_vocabulary.h"
#include "metronome/model/internal/pre_tokenizer.h"
#include "metronome/model/tokenizer.h"

namespace metronome::model {
namespace {

void AppendUtf8(std::uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

constexpr std::uint32_t kInvalid = 0xFFFFFFFF;

// Decodes one code point at text[i]; returns {kInvalid, 1} for a byte that does not start a
// well-formed, shortest-form sequence of a scalar value.
std::pair<std::uint32_t, std::size_t> DecodeUtf8(std::string_view text, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  if (b0 < 0x80) return {b0, 1};
  std::size_t len = 0;
  std::uint32_t cp = 0;
  std::uint32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {kInvalid, 1};
  }
  if (i + len > text.size()) return {kInvalid, 1};
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(text[i + k]);
    if ((b & 0xC0) != 0x80) return {kInvalid, 1};
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {kInvalid, 1};
  return {cp, len};
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves; the other 68 bytes are
// mapped, in byte order, to U+0100 onwards, so that every byte is a visible, non-space character.
struct ByteTable {
  std::uint32_t byte_to_cp[256];
  int cp_to_byte[256 + 68];  // -1 for code points outside the table
};

ByteTable MakeByteTable() {
  ByteTable t{};
  std::fill(std::begin(t.cp_to_byte), std::end(t.cp_to_byte), -1);
  std::uint32_t next = 256;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    t.byte_to_cp[b] = printable ? b : next++;
    t.cp_to_byte[t.byte_to_cp[b]] = static_cast<int>(b);
  }
  return t;
}

const ByteTable& Bytes() {
  static const ByteTable table = MakeByteTable();
  return table;
}

// ---- Unicode classes for the pre-tokenizer ----------------------------------------------------

enum class CharClass : std::uint8_t { kOther, kLetter, kNumber, kSpace };

struct ClassRange {
  std::uint32_t lo;
  std::uint32_t hi;
  CharClass cls;
};

constexpr CharClass kL = CharClass::kLetter;
constexpr CharClass kN = CharClass::kNumber;

// General categories L* (letters) and N* (numbers) as sorted, disjoint ranges, generated from the
// Unicode 14.0 character database. Unassigned code points between two ranges of the same class
// are folded in to keep the table small: text using them gets the class of their neighbours.
constexpr ClassRange kClassRanges[] = {
    {0x30, 0x39, kN},       {0x41, 0x5A, kL},       {0x61, 0x7A, kL},       {0xAA, 0xAA, kL},
    {0xB2, 0xB3, kN},       {0xB5, 0xB5, kL},       {0xB9, 0xB9, kN},       {0xBA, 0xBA, kL},
    {0xBC, 0xBE, kN},       {0xC0, 0xD6, kL},       {0xD8, 0xF6, kL},       {0xF8, 0x2C1, kL},
    {0x2C6, 0x2D1, kL},     {0x2E0, 0x2E4, kL},     {0x2EC, 0x2EC, kL},     {0x2EE, 0x2EE, kL},
    {0x370, 0x374, kL},     {0x376, 0x37D, kL},     {0x37F, 0x37F, kL},     {0x386, 0x386, kL},
    {0x388, 0x3F5, kL},     {0x3F7, 0x481, kL},     {0x48A, 0x559, kL},     {0x560, 0x588, kL},
    {0x5D0, 0x5F2, kL},     {0x620, 0x64A, kL},     {0x660, 0x669, kN},     {0x66E, 0x66F, kL},
    {0x671, 0x6D3, kL},     {0x6D5, 0x6D5, kL},     {0x6E5, 0x6E6, kL},     {0x6EE, 0x6EF, kL},
    {0x6F0, 0x6F9, kN},     {0x6FA, 0x6FC, kL},     {0x6FF, 0x6FF, kL},     {0x710, 0x710, kL},
    {0x712, 0x72F, kL},     {0x74D, 0x7A5, kL},     {0x7B1, 0x7B1, kL},     {0x7C0, 0x7C9, kN},
    {0x7CA, 0x7EA, kL},     {0x7F4, 0x7F5, kL},     {0x7FA, 0x7FA, kL},     {0x800, 0x815, kL},
    {0x81A, 0x81A, kL},     {0x824, 0x824, kL},     {0x828, 0x828, kL},     {0x840, 0x858, kL},
    {0x860, 0x887, kL},     {0x889, 0x88E, kL},     {0x8A0, 0x8C9, kL},     {0x904, 0x939, kL},
    {0x93D, 0x93D, kL},     {0x950, 0x950, kL},     {0x958, 0x961, kL},     {0x966, 0x96F, kN},
    {0x971, 0x980, kL},     {0x985, 0x9B9, kL},     {0x9BD, 0x9BD, kL},     {0x9CE, 0x9CE, kL},
    {0x9DC, 0x9E1, kL},     {0x9E6, 0x9EF, kN},     {0x9F0, 0x9F1, kL},     {0x9F4, 0x9F9, kN},
    {0x9FC, 0x9FC, kL},     {0xA05, 0xA39, kL},     {0xA59, 0xA5E, kL},     {0xA66, 0xA6F, kN},
    {0xA72, 0xA74, kL},     {0xA85, 0xAB9, kL},     {0xABD, 0xABD, kL},     {0xAD0, 0xAE1, kL},
    {0xAE6, 0xAEF, kN},     {0xAF9, 0xAF9, kL},     {0xB05, 0xB39, kL},     {0xB3D, 0xB3D, kL},
    {0xB5C, 0xB61, kL},     {0xB66, 0xB6F, kN},     {0xB71, 0xB71, kL},     {0xB72, 0xB77, kN},
    {0xB83, 0xBB9, kL},     {0xBD0, 0xBD0, kL},     {0xBE6, 0xBF2, kN},     {0xC05, 0xC39, kL},
    {0xC3D, 0xC3D, kL},     {0xC58, 0xC61, kL},     {0xC66, 0xC6F, kN},     {0xC78, 0xC7E, kN},
    {0xC80, 0xC80, kL},     {0xC85, 0xCB9, kL},     {0xCBD, 0xCBD, kL},     {0xCDD, 0xCE1, kL},
    {0xCE6, 0xCEF, kN},     {0xCF1, 0xCF2, kL},     {0xD04, 0xD3A, kL},     {0xD3D, 0xD3D, kL},
    {0xD4E, 0xD4E, kL},     {0xD54, 0xD56, kL},     {0xD58, 0xD5E, kN},     {0xD5F, 0xD61, kL},
    {0xD66, 0xD78, kN},     {0xD7A, 0xD7F, kL},     {0xD85, 0xDC6, kL},     {0xDE6, 0xDEF, kN},
    {0xE01, 0xE30, kL},     {0xE32, 0xE33, kL},     {0xE40, 0xE46, kL},     {0xE50, 0xE59, kN},
    {0xE81, 0xEB0, kL},     {0xEB2, 0xEB3, kL},     {0xEBD, 0xEC6, kL},     {0xED0, 0xED9, kN},
    {0xEDC, 0xF00, kL},     {0xF20, 0xF33, kN},     {0xF40, 0xF6C, kL},     {0xF88, 0xF8C, kL},
    {0x1000, 0x102A, kL},   {0x103F, 0x103F, kL},   {0x1040, 0x1049, kN},   {0x1050, 0x1055, kL},
    {0x105A, 0x105D, kL},   {0x1061, 0x1061, kL},   {0x1065, 0x1066, kL},   {0x106E, 0x1070, kL},
    {0x1075, 0x1081, kL},   {0x108E, 0x108E, kL},   {0x1090, 0x1099, kN},   {0x10A0, 0x10FA, kL},
    {0x10FC, 0x135A, kL},   {0x1369, 0x137C, kN},   {0x1380, 0x138F, kL},   {0x13A0, 0x13FD, kL},
    {0x1401, 0x166C, kL},   {0x166F, 0x167F, kL},   {0x1681, 0x169A, kL},   {0x16A0, 0x16EA, kL},
    {0x16EE, 0x16F0, kN},   {0x16F1, 0x1711, kL},   {0x171F, 0x1731, kL},   {0x1740, 0x1751, kL},
    {0x1760, 0x1770, kL},   {0x1780, 0x17B3, kL},   {0x17D7, 0x17D7, kL},   {0x17DC, 0x17DC, kL},
    {0x17E0, 0x17F9, kN},   {0x1810, 0x1819, kN},   {0x1820, 0x1884, kL},   {0x1887, 0x18A8, kL},
    {0x18AA, 0x191E, kL},   {0x1946, 0x194F, kN},   {0x1950, 0x19C9, kL},   {0x19D0, 0x19DA, kN},
    {0x1A00, 0x1A16, kL},   {0x1A20, 0x1A54, kL},   {0x1A80, 0x1A99, kN},   {0x1AA7, 0x1AA7, kL},
    {0x1B05, 0x1B33, kL},   {0x1B45, 0x1B4C, kL},   {0x1B50, 0x1B59, kN},   {0x1B83, 0x1BA0, kL},
    {0x1BAE, 0x1BAF, kL},   {0x1BB0, 0x1BB9, kN},   {0x1BBA, 0x1BE5, kL},   {0x1C00, 0x1C23, kL},
    {0x1C40, 0x1C49, kN},   {0x1C4D, 0x1C4F, kL},   {0x1C50, 0x1C59, kN},   {0x1C5A, 0x1C7D, kL},
    {0x1C80, 0x1CBF, kL},   {0x1CE9, 0x1CEC, kL},   {0x1CEE, 0x1CF3, kL},   {0x1CF5, 0x1CF6, kL},
    {0x1CFA, 0x1DBF, kL},   {0x1E00, 0x1FBC, kL},   {0x1FBE, 0x1FBE, kL},   {0x1FC2, 0x1FCC, kL},
    {0x1FD0, 0x1FDB, kL},   {0x1FE0, 0x1FEC, kL},   {0x1FF2, 0x1FFC, kL},   {0x2070, 0x2070, kN},
    {0x2071, 0x2071, kL},   {0x2074, 0x2079, kN},   {0x207F, 0x207F, kL},   {0x2080, 0x2089, kN},
    {0x2090, 0x209C, kL},   {0x2102, 0x2102, kL},   {0x2107, 0x2107, kL},   {0x210A, 0x2113, kL},
    {0x2115, 0x2115, kL},   {0x2119, 0x211D, kL},   {0x2124, 0x2124, kL},   {0x2126, 0x2126, kL},
    {0x2128, 0x2128, kL},   {0x212A, 0x212D, kL},   {0x212F, 0x2139, kL},   {0x213C, 0x213F, kL},
    {0x2145, 0x2149, kL},   {0x214E, 0x214E, kL},   {0x2150, 0x2182, kN},   {0x2183, 0x2184, kL},
    {0x2185, 0x2189, kN},   {0x2460, 0x249B, kN},   {0x24EA, 0x24FF, kN},   {0x2776, 0x2793, kN},
    {0x2C00, 0x2CE4, kL},   {0x2CEB, 0x2CEE, kL},   {0x2CF2, 0x2CF3, kL},   {0x2CFD, 0x2CFD, kN},
    {0x2D00, 0x2D6F, kL},   {0x2D80, 0x2DDE, kL},   {0x2E2F, 0x2E2F, kL},   {0x3005, 0x3006, kL},
    {0x3007, 0x3007, kN},   {0x3021, 0x3029, kN},   {0x3031, 0x3035, kL},   {0x3038, 0x303A, kN},
    {0x303B, 0x303C, kL},   {0x3041, 0x3096, kL},   {0x309D, 0x309F, kL},   {0x30A1, 0x30FA, kL},
    {0x30FC, 0x318E, kL},   {0x3192, 0x3195, kN},   {0x31A0, 0x31BF, kL},   {0x31F0, 0x31FF, kL},
    {0x3220, 0x3229, kN},   {0x3248, 0x324F, kN},   {0x3251, 0x325F, kN},   {0x3280, 0x3289, kN},
    {0x32B1, 0x32BF, kN},   {0x3400, 0x4DBF, kL},   {0x4E00, 0xA48C, kL},   {0xA4D0, 0xA4FD, kL},
    {0xA500, 0xA60C, kL},   {0xA610, 0xA61F, kL},   {0xA620, 0xA629, kN},   {0xA62A, 0xA66E, kL},
    {0xA67F, 0xA69D, kL},   {0xA6A0, 0xA6E5, kL},   {0xA6E6, 0xA6EF, kN},   {0xA717, 0xA71F, kL},
    {0xA722, 0xA788, kL},   {0xA78B, 0xA801, kL},   {0xA803, 0xA805, kL},   {0xA807, 0xA80A, kL},
    {0xA80C, 0xA822, kL},   {0xA830, 0xA835, kN},   {0xA840, 0xA873, kL},   {0xA882, 0xA8B3, kL},
    {0xA8D0, 0xA8D9, kN},   {0xA8F2, 0xA8F7, kL},   {0xA8FB, 0xA8FB, kL},   {0xA8FD, 0xA8FE, kL},
    {0xA900, 0xA909, kN},   {0xA90A, 0xA925, kL},   {0xA930, 0xA946, kL},   {0xA960, 0xA97C, kL},
    {0xA984, 0xA9B2, kL},   {0xA9CF, 0xA9CF, kL},   {0xA9D0, 0xA9D9, kN},   {0xA9E0, 0xA9E4, kL},
    {0xA9E6, 0xA9EF, kL},   {0xA9F0, 0xA9F9, kN},   {0xA9FA, 0xAA28, kL},   {0xAA40, 0xAA42, kL},
    {0xAA44, 0xAA4B, kL},   {0xAA50, 0xAA59, kN},   {0xAA60, 0xAA76, kL},   {0xAA7A, 0xAA7A, kL},
    {0xAA7E, 0xAAAF, kL},   {0xAAB1, 0xAAB1, kL},   {0xAAB5, 0xAAB6, kL},   {0xAAB9, 0xAABD, kL},
    {0xAAC0, 0xAAC0, kL},   {0xAAC2, 0xAADD, kL},   {0xAAE0, 0xAAEA, kL},   {0xAAF2, 0xAAF4, kL},
    {0xAB01, 0xAB5A, kL},   {0xAB5C, 0xAB69, kL},   {0xAB70, 0xABE2, kL},   {0xABF0, 0xABF9, kN},
    {0xAC00, 0xD7FB, kL},   {0xF900, 0xFB1D, kL},   {0xFB1F, 0xFB28, kL},   {0xFB2A, 0xFBB1, kL},
    {0xFBD3, 0xFD3D, kL},   {0xFD50, 0xFDC7, kL},   {0xFDF0, 0xFDFB, kL},   {0xFE70, 0xFEFC, kL},
    {0xFF10, 0xFF19, kN},   {0xFF21, 0xFF3A, kL},   {0xFF41, 0xFF5A, kL},   {0xFF66, 0xFFDC, kL},
    {0x10000, 0x100FA, kL}, {0x10107, 0x10133, kN}, {0x10140, 0x10178, kN}, {0x1018A, 0x1018B, kN},
    {0x10280, 0x102D0, kL}, {0x102E1, 0x102FB, kN}, {0x10300, 0x1031F, kL}, {0x10320, 0x10323, kN},
    {0x1032D, 0x10340, kL}, {0x10341, 0x10341, kN}, {0x10342, 0x10349, kL}, {0x1034A, 0x1034A, kN},
    {0x10350, 0x10375, kL}, {0x10380, 0x1039D, kL}, {0x103A0, 0x103CF, kL}, {0x103D1, 0x103D5, kN},
    {0x10400, 0x1049D, kL}, {0x104A0, 0x104A9, kN}, {0x104B0, 0x10563, kL}, {0x10570, 0x10855, kL},
    {0x10858, 0x1085F, kN}, {0x10860, 0x10876, kL}, {0x10879, 0x1087F, kN}, {0x10880, 0x1089E, kL},
    {0x108A7, 0x108AF, kN}, {0x108E0, 0x108F5, kL}, {0x108FB, 0x108FF, kN}, {0x10900, 0x10915, kL},
    {0x10916, 0x1091B, kN}, {0x10920, 0x10939, kL}, {0x10980, 0x109B7, kL}, {0x109BC, 0x109BD, kN},
    {0x109BE, 0x109BF, kL}, {0x109C0, 0x109FF, kN}, {0x10A00, 0x10A00, kL}, {0x10A10, 0x10A35, kL},
    {0x10A40, 0x10A48, kN}, {0x10A60, 0x10A7C, kL}, {0x10A7D, 0x10A7E, kN}, {0x10A80, 0x10A9C, kL},
    {0x10A9D, 0x10A9F, kN}, {0x10AC0, 0x10AC7, kL}, {0x10AC9, 0x10AE4, kL}, {0x10AEB, 0x10AEF, kN},
    {0x10B00, 0x10B35, kL}, {0x10B40, 0x10B55, kL}, {0x10B58, 0x10B5F, kN}, {0x10B60, 0x10B72, kL},
    {0x10B78, 0x10B7F, kN}, {0x10B80, 0x10B91, kL}, {0x10BA9, 0x10BAF, kN}, {0x10C00, 0x10CF2, kL},
    {0x10CFA, 0x10CFF, kN}, {0x10D00, 0x10D23, kL}, {0x10D30, 0x10E7E, kN}, {0x10E80, 0x10EA9, kL},
    {0x10EB0, 0x10F1C, kL}, {0x10F1D, 0x10F26, kN}, {0x10F27, 0x10F45, kL}, {0x10F51, 0x10F54, kN},
    {0x10F70, 0x10F81, kL}, {0x10FB0, 0x10FC4, kL}, {0x10FC5, 0x10FCB, kN}, {0x10FE0, 0x10FF6, kL},
    {0x11003, 0x11037, kL}, {0x11052, 0x1106F, kN}, {0x11071, 0x11072, kL}, {0x11075, 0x11075, kL},
    {0x11083, 0x110AF, kL}, {0x110D0, 0x110E8, kL}, {0x110F0, 0x110F9, kN}, {0x11103, 0x11126, kL},
    {0x11136, 0x1113F, kN}, {0x11144, 0x11144, kL}, {0x11147, 0x11172, kL}, {0x11176, 0x11176, kL},
    {0x11183, 0x111B2, kL}, {0x111C1, 0x111C4, kL}, {0x111D0, 0x111D9, kN}, {0x111DA, 0x111DA, kL},
    {0x111DC, 0x111DC, kL}, {0x111E1, 0x111F4, kN}, {0x11200, 0x1122B, kL}, {0x11280, 0x112A8, kL},
    {0x112B0, 0x112DE, kL}, {0x112F0, 0x112F9, kN}, {0x11305, 0x11339, kL}, {0x1133D, 0x1133D, kL},
    {0x11350, 0x11350, kL}, {0x1135D, 0x11361, kL}, {0x11400, 0x11434, kL}, {0x11447, 0x1144A, kL},
    {0x11450, 0x11459, kN}, {0x1145F, 0x114AF, kL}, {0x114C4, 0x114C5, kL}, {0x114C7, 0x114C7, kL},
    {0x114D0, 0x114D9, kN}, {0x11580, 0x115AE, kL}, {0x115D8, 0x115DB, kL}, {0x11600, 0x1162F, kL},
    {0x11644, 0x11644, kL}, {0x11650, 0x11659, kN}, {0x11680, 0x116AA, kL}, {0x116B8, 0x116B8, kL},
    {0x116C0, 0x116C9, kN}, {0x11700, 0x1171A, kL}, {0x11730, 0x1173B, kN}, {0x11740, 0x1182B, kL},
    {0x118A0, 0x118DF, kL}, {0x118E0, 0x118F2, kN}, {0x118FF, 0x1192F, kL}, {0x1193F, 0x1193F, kL},
    {0x11941, 0x11941, kL}, {0x11950, 0x11959, kN}, {0x119A0, 0x119D0, kL}, {0x119E1, 0x119E1, kL},
    {0x119E3, 0x119E3, kL}, {0x11A00, 0x11A00, kL}, {0x11A0B, 0x11A32, kL}, {0x11A3A, 0x11A3A, kL},
    {0x11A50, 0x11A50, kL}, {0x11A5C, 0x11A89, kL}, {0x11A9D, 0x11A9D, kL}, {0x11AB0, 0x11C2E, kL},
    {0x11C40, 0x11C40, kL}, {0x11C50, 0x11C6C, kN}, {0x11C72, 0x11C8F, kL}, {0x11D00, 0x11D30, kL},
    {0x11D46, 0x11D46, kL}, {0x11D50, 0x11D59, kN}, {0x11D60, 0x11D89, kL}, {0x11D98, 0x11D98, kL},
    {0x11DA0, 0x11DA9, kN}, {0x11EE0, 0x11EF2, kL}, {0x11FB0, 0x11FB0, kL}, {0x11FC0, 0x11FD4, kN},
    {0x12000, 0x12399, kL}, {0x12400, 0x1246E, kN}, {0x12480, 0x12FF0, kL}, {0x13000, 0x1342E, kL},
    {0x14400, 0x16A5E, kL}, {0x16A60, 0x16A69, kN}, {0x16A70, 0x16ABE, kL}, {0x16AC0, 0x16AC9, kN},
    {0x16AD0, 0x16AED, kL}, {0x16B00, 0x16B2F, kL}, {0x16B40, 0x16B43, kL}, {0x16B50, 0x16B61, kN},
    {0x16B63, 0x16E7F, kL}, {0x16E80, 0x16E96, kN}, {0x16F00, 0x16F4A, kL}, {0x16F50, 0x16F50, kL},
    {0x16F93, 0x16FE1, kL}, {0x16FE3, 0x16FE3, kL}, {0x17000, 0x1BC99, kL}, {0x1D2E0, 0x1D2F3, kN},
    {0x1D360, 0x1D378, kN}, {0x1D400, 0x1D6C0, kL}, {0x1D6C2, 0x1D6DA, kL}, {0x1D6DC, 0x1D6FA, kL},
    {0x1D6FC, 0x1D714, kL}, {0x1D716, 0x1D734, kL}, {0x1D736, 0x1D74E, kL}, {0x1D750, 0x1D76E, kL},
    {0x1D770, 0x1D788, kL}, {0x1D78A, 0x1D7A8, kL}, {0x1D7AA, 0x1D7C2, kL}, {0x1D7C4, 0x1D7CB, kL},
    {0x1D7CE, 0x1D7FF, kN}, {0x1DF00, 0x1DF1E, kL}, {0x1E100, 0x1E12C, kL}, {0x1E137, 0x1E13D, kL},
    {0x1E140, 0x1E149, kN}, {0x1E14E, 0x1E14E, kL}, {0x1E290, 0x1E2AD, kL}, {0x1E2C0, 0x1E2EB, kL},
    {0x1E2F0, 0x1E2F9, kN}, {0x1E7E0, 0x1E8C4, kL}, {0x1E8C7, 0x1E8CF, kN}, {0x1E900, 0x1E943, kL},
    {0x1E94B, 0x1E94B, kL}, {0x1E950, 0x1E959, kN}, {0x1EC71, 0x1ECAB, kN}, {0x1ECAD, 0x1ECAF, kN},
    {0x1ECB1, 0x1ED2D, kN}, {0x1ED2F, 0x1ED3D, kN}, {0x1EE00, 0x1EEBB, kL}, {0x1F100, 0x1F10C, kN},
    {0x1FBF0, 0x1FBF9, kN}, {0x20000, 0x3134A, kL},
};

bool IsWhiteSpace(std::uint32_t cp) {
  // Unicode White_Space property, which is what the pattern's \s means.
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

CharClass Classify(std::uint32_t cp) {
  if (cp == kInvalid) return CharClass::kOther;
  if (IsWhiteSpace(cp)) return CharClass::kSpace;
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    return CharClass::kOther;
  }
  const auto* it = std::upper_bound(std::begin(kClassRanges), std::end(kClassRanges), cp,
                                    [](std::uint32_t c, const ClassRange& r) { return c < r.lo; });
  if (it == std::begin(kClassRanges)) return CharClass::kOther;
  --it;
  return cp <= it->hi ? it->cls : CharClass::kOther;
}

struct CodePoint {
  std::uint32_t cp;
  CharClass cls;
  std::size_t offset;  // of its first byte in the segment
};

bool IsNewline(std::uint32_t cp) { return cp == '\r' || cp == '\n'; }

char AsciiLower(std::uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return static_cast<char>(cp - 'A' + 'a');
  return cp < 0x80 ? static_cast<char>(cp) : '\0';
}

// General category P* (punctuation) outside ASCII as sorted, disjoint ranges, generated from the
// Unicode 14.0 character database (Python's unicodedata); only the default pre-tokenizer uses it.
struct PunctRange {
  std::uint32_t lo;
  std::uint32_t hi;
};
constexpr PunctRange kPunctRanges[] = {
    {0xA1, 0xA1},       {0xA7, 0xA7},       {0xAB, 0xAB},       {0xB6, 0xB7},
    {0xBB, 0xBB},       {0xBF, 0xBF},       {0x37E, 0x37E},     {0x387, 0x387},
    {0x55A, 0x55F},     {0x589, 0x58A},     {0x5BE, 0x5BE},     {0x5C0, 0x5C0},
    {0x5C3, 0x5C3},     {0x5C6, 0x5C6},     {0x5F3, 0x5F4},     {0x609, 0x60A},
    {0x60C, 0x60D},     {0x61B, 0x61B},     {0x61D, 0x61F},     {0x66A, 0x66D},
    {0x6D4, 0x6D4},     {0x700, 0x70D},     {0x7F7, 0x7F9},     {0x830, 0x83E},
    {0x85E, 0x85E},     {0x964, 0x965},     {0x970, 0x970},     {0x9FD, 0x9FD},
    {0xA76, 0xA76},     {0xAF0, 0xAF0},     {0xC77, 0xC77},     {0xC84, 0xC84},
    {0xDF4, 0xDF4},     {0xE4F, 0xE4F},     {0xE5A, 0xE5B},     {0xF04, 0xF12},
    {0xF14, 0xF14},     {0xF3A, 0xF3D},     {0xF85, 0xF85},     {0xFD0, 0xFD4},
    {0xFD9, 0xFDA},     {0x104A, 0x104F},   {0x10FB, 0x10FB},   {0x1360, 0x1368},
    {0x1400, 0x1400},   {0x166E, 0x166E},   {0x169B, 0x169C},   {0x16EB, 0x16ED},
    {0x1735, 0x1736},   {0x17D4, 0x17D6},   {0x17D8, 0x17DA},   {0x1800, 0x180A},
    {0x1944, 0x1945},   {0x1A1E, 0x1A1F},   {0x1AA0, 0x1AA6},   {0x1AA8, 0x1AAD},
    {0x1B5A, 0x1B60},   {0x1B7D, 0x1B7E},   {0x1BFC, 0x1BFF},   {0x1C3B, 0x1C3F},
    {0x1C7E, 0x1C7F},   {0x1CC0, 0x1CC7},   {0x1CD3, 0x1CD3},   {0x2010, 0x2027},
    {0x2030, 0x2043},   {0x2045, 0x2051},   {0x2053, 0x205E},   {0x207D, 0x207E},
    {0x208D, 0x208E},   {0x2308, 0x230B},   {0x2329, 0x232A},   {0x2768, 0x2775},
    {0x27C5, 0x27C6},   {0x27E6, 0x27EF},   {0x2983, 0x2998},   {0x29D8, 0x29DB},
    {0x29FC, 0x29FD},   {0x2CF9, 0x2CFC},   {0x2CFE, 0x2CFF},   {0x2D70, 0x2D70},
    {0x2E00, 0x2E2E},   {0x2E30, 0x2E4F},   {0x2E52, 0x2E5D},   {0x3001, 0x3003},
    {0x3008, 0x3011},   {0x3014, 0x301F},   {0x3030, 0x3030},   {0x303D, 0x303D},
    {0x30A0, 0x30A0},   {0x30FB, 0x30FB},   {0xA4FE, 0xA4FF},   {0xA60D, 0xA60F},
    {0xA673, 0xA673},   {0xA67E, 0xA67E},   {0xA6F2, 0xA6F7},   {0xA874, 0xA877},
    {0xA8CE, 0xA8CF},   {0xA8F8, 0xA8FA},   {0xA8FC, 0xA8FC},   {0xA92E, 0xA92F},
    {0xA95F, 0xA95F},   {0xA9C1, 0xA9CD},   {0xA9DE, 0xA9DF},   {0xAA5C, 0xAA5F},
    {0xAADE, 0xAADF},   {0xAAF0, 0xAAF1},   {0xABEB, 0xABEB},   {0xFD3E, 0xFD3F},
    {0xFE10, 0xFE19},   {0xFE30, 0xFE52},   {0xFE54, 0xFE61},   {0xFE63, 0xFE63},
    {0xFE68, 0xFE68},   {0xFE6A, 0xFE6B},   {0xFF01, 0xFF03},   {0xFF05, 0xFF0A},
    {0xFF0C, 0xFF0F},   {0xFF1A, 0xFF1B},   {0xFF1F, 0xFF20},   {0xFF3B, 0xFF3D},
    {0xFF3F, 0xFF3F},   {0xFF5B, 0xFF5B},   {0xFF5D, 0xFF5D},   {0xFF5F, 0xFF65},
    {0x10100, 0x10102}, {0x1039F, 0x1039F}, {0x103D0, 0x103D0}, {0x1056F, 0x1056F},
    {0x10857, 0x10857}, {0x1091F, 0x1091F}, {0x1093F, 0x1093F}, {0x10A50, 0x10A58},
    {0x10A7F, 0x10A7F}, {0x10AF0, 0x10AF6}, {0x10B39, 0x10B3F}, {0x10B99, 0x10B9C},
    {0x10EAD, 0x10EAD}, {0x10F55, 0x10F59}, {0x10F86, 0x10F89}, {0x11047, 0x1104D},
    {0x110BB, 0x110BC}, {0x110BE, 0x110C1}, {0x11140, 0x11143}, {0x11174, 0x11175},
    {0x111C5, 0x111C8}, {0x111CD, 0x111CD}, {0x111DB, 0x111DB}, {0x111DD, 0x111DF},
    {0x11238, 0x1123D}, {0x112A9, 0x112A9}, {0x1144B, 0x1144F}, {0x1145A, 0x1145B},
    {0x1145D, 0x1145D}, {0x114C6, 0x114C6}, {0x115C1, 0x115D7}, {0x11641, 0x11643},
    {0x11660, 0x1166C}, {0x116B9, 0x116B9}, {0x1173C, 0x1173E}, {0x1183B, 0x1183B},
    {0x11944, 0x11946}, {0x119E2, 0x119E2}, {0x11A3F, 0x11A46}, {0x11A9A, 0x11A9C},
    {0x11A9E, 0x11AA2}, {0x11C41, 0x11C45}, {0x11C70, 0x11C71}, {0x11EF7, 0x11EF8},
    {0x11FFF, 0x11FFF}, {0x12470, 0x12474}, {0x12FF1, 0x12FF2}, {0x16A6E, 0x16A6F},
    {0x16AF5, 0x16AF5}, {0x16B37, 0x16B3B}, {0x16B44, 0x16B44}, {0x16E97, 0x16E9A},
    {0x16FE2, 0x16FE2}, {0x1BC9F, 0x1BC9F}, {0x1DA87, 0x1DA8B}, {0x1E95E, 0x1E95F},
};

bool IsPunctuation(std::uint32_t cp) {
  if (cp < 0x80) {
    return (cp >= 0x21 && cp <= 0x2F && cp != '$' && cp != '+') || cp == ':' || cp == ';' ||
           cp == '?' || cp == '@' || (cp >= '[' && cp <= ']') || cp == '_' || cp == '{' ||
           cp == '}';
  }
  const auto* it = std::upper_bound(std::begin(kPunctRanges), std::end(kPunctRanges), cp,
                                    [](std::uint32_t c, const PunctRange& r) { return c < r.lo; });
  return it != std::begin(kPunctRanges) && cp <= (it - 1)->hi;
}

// A piece of a segment as [begin, end) code point indices.
using Piece = std::pair<std::size_t, std::size_t>;

// One stage of a multi-pattern pre-tokenizer (llama.cpp applies each pattern of a list to the
// pieces of the previous one, keeping both the matches and the text between them): splits
// `piece` into maximal runs of code points that satisfy `in_run`, each cut into chunks of at most
// `max_run`, and the stretches between them.
template <typename Pred>
void IsolateRuns(const std::vector<CodePoint>& cps, Piece piece, Pred in_run, std::size_t max_run,
                 std::vector<Piece>& out) {
  std::size_t gap = piece.first;
  std::size_t i = piece.first;
  while (i < piece.second) {
    if (!in_run(cps[i])) {
      ++i;
      continue;
    }
    if (gap < i) out.emplace_back(gap, i);
    std::size_t j = i;
    while (j < piece.second && in_run(cps[j])) ++j;
    for (std::size_t k = i; k < j;) {
      const std::size_t chunk_end = j - k <= max_run ? j : k + max_run;
      out.emplace_back(k, chunk_end);
      k = chunk_end;
    }
    i = gap = j;
  }
  if (gap < piece.second) out.emplace_back(gap, piece.second);
}

// The GPT-4-style pattern of llama-bpe (max_digits 3) and qwen2 (max_digits 1), tried in this
// order at each position (first alternative that matches):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,max_digits} |
//    ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
// Every code point is a letter, a number, a space or none of them (the fourth alternative), so
// each step consumes at least one code point.
void SplitGpt4Style(const std::vector<CodePoint>& cps, Piece piece, std::size_t max_digits,
                    std::vector<Piece>& out) {
  const std::size_t n = piece.second;
  const auto is = [&](std::size_t k, CharClass c) { return k < n && cps[k].cls == c; };
  const auto is_punct = [&](std::size_t k) { return is(k, CharClass::kOther); };
  std::size_t i = piece.first;
  while (i < n) {
    const std::uint32_t c = cps[i].cp;
    std::size_t end = i;  // exclusive, in code points

    if (c == '\'' && i + 1 < n) {
      const char a = AsciiLower(cps[i + 1].cp);
      const char b = i + 2 < n ? AsciiLower(cps[i + 2].cp) : '\0';
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        end = i + 2;
      } else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        end = i + 3;
      }
    }
    if (end == i) {
      std::size_t j = i;
      if (!is(i, CharClass::kLetter) && !is(i, CharClass::kNumber) && !IsNewline(c) &&
          is(i + 1, CharClass::kLetter)) {
        j = i + 1;
      }
      if (is(j, CharClass::kLetter)) {
        while (is(j, CharClass::kLetter)) ++j;
        end = j;
      }
    }
    if (end == i && is(i, CharClass::kNumber)) {
      std::size_t j = i;
      while (j - i < max_digits && is(j, CharClass::kNumber)) ++j;
      end = j;
    }
    if (end == i) {
      std::size_t j = (c == ' ' && is_punct(i + 1)) ? i + 1 : i;
      if (is_punct(j)) {
        while (is_punct(j)) ++j;
        while (j < n && IsNewline(cps[j].cp)) ++j;
        end = j;
      }
    }
    if (end == i) {
      // Only whitespace is left here.
      std::size_t j = i;
      std::size_t last_newline = n;
      while (is(j, CharClass::kSpace)) {
        if (IsNewline(cps[j].cp)) last_newline = j;
        ++j;
      }
      if (last_newline != n) {
        end = last_newline + 1;  // \s*[\r\n]+ backtracks to the run's last newline
      } else if (j == n || j - i == 1) {
        end = j;  // \s+(?!\S) at the end of text, or the lone-space \s+
      } else {
        end = j - 1;  // leave one space to lead the next word
      }
    }
    out.emplace_back(i, end);
    i = end;
  }
}

// GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ |
// \s+(?!\S) | \s+ (the last as llama.cpp runs it: whitespace no pattern matches is one piece).
// Contractions are case-sensitive here.
void SplitGpt2(const std::vector<CodePoint>& cps, Piece piece, std::vector<Piece>& out) {
  const std::size_t n = piece.second;
  const auto cls = [&](std::size_t k) { return k < n ? cps[k].cls : CharClass::kSpace; };
  std::size_t i = piece.first;
  while (i < n) {
    const std::uint32_t c = cps[i].cp;
    std::size_t end = i;
    if (c == '\'' && i + 1 < n) {
      const std::uint32_t a = cps[i + 1].cp;
      const std::uint32_t b = i + 2 < n ? cps[i + 2].cp : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        end = i + 2;
      } else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        end = i + 3;
      }
    }
    if (end == i) {
      // A space joins the run of the class that follows it (letters, numbers or other).
      const std::size_t j0 = (c == ' ' && i + 1 < n && cls(i + 1) != CharClass::kSpace) ? i + 1 : i;
      const CharClass run = cls(j0);
      if (run != CharClass::kSpace) {
        std::size_t j = j0;
        while (j < n && cls(j) == run) ++j;
        end = j;
      }
    }
    if (end == i) {
      std::size_t j = i;
      while (j < n && cls(j) == CharClass::kSpace) ++j;
      end = (j - i > 1 && j < n) ? j - 1 : j;  // leave one space to lead the next word
    }
    out.emplace_back(i, end);
    i = end;
  }
}

// Splits `text` (no special tokens inside) into pre-tokens as `pre` does, appended to `out` as
// [begin, end) byte offsets.
void PreTokenize(std::string_view text, PreTokenizer pre,
                 std::vector<std::pair<std::size_t, std::size_t>>& out) {
  std::vector<CodePoint> cps;
  cps.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto [cp, len] = DecodeUtf8(text, i);
    cps.push_back({cp, Classify(cp), i});
    i += len;
  }
  const std::size_t n = cps.size();
  const auto is_number = [](const CodePoint& c) { return c.cls == CharClass::kNumber; };
  std::vector<Piece> pieces;
  std::vector<Piece> next;
  const auto stage = [&](auto&& split) {
    next.clear();
    for (const Piece& p : pieces) split(p);
    pieces.swap(next);
  };
  pieces.emplace_back(0, n);
  switch (pre) {
    case PreTokenizer::kLlama3:
      stage([&](Piece p) { SplitGpt4Style(cps, p, 3, next); });
      break;
    case PreTokenizer::kQwen2:
      stage([&](Piece p) { SplitGpt4Style(cps, p, 1, next); });
      break;
    case PreTokenizer::kGpt2:
      stage([&](Piece p) { SplitGpt2(cps, p, next); });
      break;
    case PreTokenizer::kSmollm:
      stage([&](Piece p) { IsolateRuns(cps, p, is_number, 1, next); });
      stage([&](Piece p) { SplitGpt2(cps, p, next); });
      break;
    case PreTokenizer::kDefault: {
      const auto punct_or_symbol = [](const CodePoint& c) {
        return IsPunctuation(c.cp) || c.cp == '$' || c.cp == '+' || c.cp == '<' || c.cp == '=' ||
               c.cp == '>' || c.cp == '^' || c.cp == '~' || c.cp == '|';
      };
      const auto ascii_digit = [](const CodePoint& c) { return c.cp >= '0' && c.cp <= '9'; };
      stage([&](Piece p) { IsolateRuns(cps, p, punct_or_symbol, SIZE_MAX, next); });
      stage([&](Piece p) { SplitGpt2(cps, p, next); });
      stage([&](Piece p) { IsolateRuns(cps, p, is_number, SIZE_MAX, next); });
      stage([&](Piece p) { IsolateRuns(cps, p, ascii_digit, 3, next); });
      break;
    }
  }
  const auto offset = [&](std::size_t k) { return k < n ? cps[k].offset : text.size(); };
  for (const Piece& p : pieces) out.emplace_back(offset(p.first), offset(p.second));
}

struct PreTokenizerSpelling {
  std::string_view name;
  PreTokenizer pre;
};
// llama.cpp's names for each (the first is the one written back).
constexpr PreTokenizerSpelling kPreTokenizerNames[] = {
    {"default", PreTokenizer::kDefault},  {"gpt-2", PreTokenizer::kGpt2},
    {"llama-bpe", PreTokenizer::kLlama3}, {"llama3", PreTokenizer::kLlama3},
    {"llama-v3", PreTokenizer::kLlama3},  {"qwen2", PreTokenizer::kQwen2},
    {"smollm", PreTokenizer::kSmollm},
};

// ---- Tokenizer --------------------------------------------------------------------------------

class Gpt2Tokenizer final : public Tokenizer {
 public:
  Gpt2Tokenizer(Vocabulary vocab, bool adds_bos_by_default);

  std::vector<TokenId> Encode(std::string_view text, bool add_bos) const override;
  std::string DecodeToken(TokenId prev, TokenId id) const override;

 private:
  struct Merge {
    std::int32_t rank;
    TokenId result;
  };
  static std::uint64_t PairKey(TokenId left, TokenId right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
           static_cast<std::uint32_t>(right);
  }

  void EncodeSegment(std::string_view text, std::vector<TokenId>& out) const;
  void EncodeWord(std::string_view word, std::vector<TokenId>& out) const;

  std::unordered_map<std::uint64_t, Merge> merges_;
  // Byte-level spelling -> id of the ordinary tokens; kept only for whole_words_.
  std::unordered_map<std::string, TokenId, internal::StringHash, std::equal_to<>> text_to_id_;
  bool whole_words_ = false;
  std::vector<std::string> decoded_;
  TokenId byte_to_id_[256];  // -1 for a byte the vocabulary has no token for
  // Literal-match tokens indexed by first byte, longest first so that the longest one wins.
  std::vector<std::pair<std::string, TokenId>> specials_by_byte_[256];
};

// llama.cpp prepends BOS for llama-bpe vocabularies unless the file says otherwise; for the other
// gpt2 ones only when the file says so.
Gpt2Tokenizer::Gpt2Tokenizer(Vocabulary vocab_in, bool adds_bos_by_default)
    : Tokenizer(
          std::move(vocab_in),
          {.kind = "gpt2", .ggml_model = "gpt2", .adds_bos_by_default = adds_bos_by_default}) {
  const Vocabulary& vocab = vocabulary();
  const std::size_t n = vocab.tokens.size();

  const ByteTable& bytes = Bytes();
  std::unordered_map<std::string, TokenId, internal::StringHash, std::equal_to<>> text_to_id;
  text_to_id.reserve(n);
  decoded_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto id = static_cast<TokenId>(i);
    const std::string& text = vocab.tokens[i];
    const std::int32_t type = vocab.token_types.empty() ? 0 : vocab.token_types[i];
    if (type == internal::kTypeControl) continue;  // never produced from plain text
    if (type == internal::kTypeUserDefined) {
      // Matched literally in plain text, as llama.cpp does; stored as plain text, not in the
      // byte-level alphabet.
      if (!text.empty()) {
        specials_by_byte_[static_cast<unsigned char>(text[0])].emplace_back(text, id);
      }
      decoded_[i] = text;
      continue;
    }
    if (type == internal::kTypeUnknown || type == internal::kTypeUnused || id == bos_id() ||
        id == eos_id())
      continue;
    text_to_id.emplace(text, id);  // first id wins for duplicate spellings
    std::string& d = decoded_[i];
    for (std::size_t k = 0; k < text.size();) {
      const auto [cp, len] = DecodeUtf8(text, k);
      if (cp != kInvalid && cp < std::size(bytes.cp_to_byte) && bytes.cp_to_byte[cp] >= 0) {
        d.push_back(static_cast<char>(bytes.cp_to_byte[cp]));
      } else {
        d.append(text, k, len);  // not in the byte alphabet: keep the spelling as it is
      }
      k += len;
    }
  }
  for (auto& list : specials_by_byte_) {
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(bytes.byte_to_cp[b], s);
    const auto it = text_to_id.find(s);
    // Some vocabularies lack the bytes valid UTF-8 never holds (0xC0, 0xF5..): such a byte stays
    // a symbol that merges with nothing and produces no token, as llama.cpp drops it.
    byte_to_id_[b] = it == text_to_id.end() ? -1 : it->second;
  }

  merges_.reserve(vocab.merges.size());
  std::string joined;
  for (std::size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string_view rule = vocab.merges[rank];
    const std::size_t space = rule.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == rule.size() ||
        rule.find(' ', space + 1) != std::string_view::npos) {
      throw LoadError("gpt2 vocabulary: merge " + std::to_string(rank) +
                      " is not \"left right\": \"" + std::string(rule) + "\"");
    }
    const std::string_view left = rule.substr(0, space);
    const std::string_view right = rule.substr(space + 1);
    joined.assign(left);
    joined.append(right);
    const auto l = text_to_id.find(left);
    const auto r = text_to_id.find(right);
    const auto m = text_to_id.find(joined);
    // Rules naming tokens the vocabulary lacks can never fire; they are skipped, not fatal.
    if (l == text_to_id.end() || r == text_to_id.end() || m == text_to_id.end()) continue;
    merges_.try_emplace(PairKey(l->second, r->second),
                        Merge{static_cast<std::int32_t>(rank), m->second});
  }
  whole_words_ = vocab.pre == PreTokenizer::kLlama3;
  if (whole_words_) text_to_id_ = std::move(text_to_id);
}

std::vector<TokenId> Gpt2Tokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<TokenId> out;
  if (add_bos && bos_id() >= 0) out.push_back(bos_id());
  std::size_t segment_start = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto& candidates = specials_by_byte_[static_cast<unsigned char>(text[i])];
    const std::pair<std::string, TokenId>* match = nullptr;
    for (const auto& candidate : candidates) {
      if (text.substr(i, candidate.first.size()) == candidate.first) {
        match = &candidate;
        break;
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    EncodeSegment(text.substr(segment_start, i - segment_start), out);
    out.push_back(match->second);
    i += match->first.size();
    segment_start = i;
  }
  EncodeSegment(text.substr(segment_start), out);
  return out;
}

void Gpt2Tokenizer::EncodeSegment(std::string_view text, std::vector<TokenId>& out) const {
  if (text.empty()) return;
  std::vector<std::pair<std::size_t, std::size_t>> words;
  PreTokenize(text, vocabulary().pre, words);
  for (const auto& [begin, end] : words) EncodeWord(text.substr(begin, end - begin), out);
}

void Gpt2Tokenizer::EncodeWord(std::string_view word, std::vector<TokenId>& out) const {
  if (whole_words_) {
    // llama-bpe (llama.cpp's ignore_merges): a word that is itself a token is that token, even
    // where the merges would reach a different split.
    std::string spelled;
    for (const char ch : word)
      AppendUtf8(Bytes().byte_to_cp[static_cast<unsigned char>(ch)], spelled);
    if (const auto it = text_to_id_.find(spelled); it != text_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // One symbol per byte to start with, merged by rank (internal/bpe_merge.h).
  struct Symbol {
    TokenId id;
    std::size_t prev;
    std::size_t next;
    bool alive;
  };
  std::vector<Symbol> symbols(word.size());
  for (std::size_t i = 0; i < word.size(); ++i) {
    symbols[i] = {byte_to_id_[static_cast<unsigned char>(word[i])], 0, 0, true};
  }
  internal::LinkInOrder(symbols);
  struct Candidate {
    std::int32_t rank;
    std::size_t left;
    std::size_t right;
    TokenId left_id;  // ids when queued; any change since makes the entry stale
    TokenId right_id;
    TokenId result;
  };
  const auto worse = [](const Candidate& a, const Candidate& b) {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.left > b.left;
  };
  const auto propose = [&](std::size_t left, std::size_t right) -> std::optional<Candidate> {
    const auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return std::nullopt;
    return Candidate{it->second.rank,  left, right, symbols[left].id, symbols[right].id,
                     it->second.result};
  };
  const auto merge = [&](const Candidate& c) {
    Symbol& l = symbols[c.left];
    Symbol& r = symbols[c.right];
    if (!l.alive || !r.alive || l.id != c.left_id || r.id != c.right_id) return false;
    l.id = c.result;
    r.alive = false;
    return true;
  };
  internal::MergeBestFirst<Candidate>(symbols, propose, worse, merge);
  internal::ForEachLinked(symbols, [&](const Symbol& s) {
    if (s.id >= 0) out.push_back(s.id);
  });
}

std::string Gpt2Tokenizer::DecodeToken(TokenId /*prev*/, TokenId id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return decoded_[static_cast<std::size_t>(id)];
}

}  // namespace

std::unique_ptr<Tokenizer> MakeGpt2Tokenizer(Vocabulary vocab) {
  const bool adds_bos_by_default = vocab.pre == PreTokenizer::kLlama3;
  return std::make_unique<Gpt2Tokenizer>(std::move(vocab), adds_bos_by_default);
}

std::optional<PreTokenizer> ParsePreTokenizer(std::string_view name) {
  if (name.empty()) return PreTokenizer::kDefault;
  for (const PreTokenizerSpelling& s : kPreTokenizerNames) {
    if (s.name == name) return s.pre;
  }
  return std::nullopt;
}

std::string PreTokenizerNames() {
  std::string names;
  for (const PreTokenizerSpelling& s : kPreTokenizerNames) {
    names += (names.empty() ? "" : ", ") + std::string(s.name);
  }
  return names;
}

std::string_view PreTokenizerName(PreTokenizer p) {
  for (const PreTokenizerSpelling& s : kPreTokenizerNames) {
    if (s.pre == p) return s.name;
  }
  return "default";
}

namespace internal {

std::vector<std::string> PreTokenizeWords(std::string_view text, PreTokenizer pre) {
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  PreTokenize(text, pre, spans);
  std::vector<std::string> words;
  words.reserve(spans.size());
  for (const auto& [begin, end] : spans) words.emplace_back(text.substr(begin, end - begin));
  return words;
}

}  // namespace internal

}  // namespace metronome::model
