#include "metronome/model/internal/gguf_schema.h"

#include <algorithm>
#include <set>
#include <string>
#include <variant>

#include "metronome/base/errors.h"
#include "metronome/model/internal/gguf_tensors.h"
#include "metronome/model/tokenizer.h"

namespace metronome::model::internal {
namespace {

std::string Quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string StringValue(const GgufFile& g, const std::string& key) {
  const auto* s = std::get_if<std::string>(g.Find(key));
  return s != nullptr ? *s : std::string();
}

// ---- value checks (each names what it refuses; "" accepts) -------------------------------------

std::string CheckRopeScaling(const GgufFile& g, const std::string& key) {
  const std::string t = StringValue(g, key);
  if (ParseRopeScaling(t)) return "";
  return "rope scaling type " + Quoted(t) +
         " is not implemented (supported: " + std::string(kRopeScalingNames) + ")";
}

// Attention is causal; a file may say so, not the opposite.
std::string CheckCausal(const GgufFile& g, const std::string& key) {
  const auto* b = std::get_if<bool>(g.Find(key));
  if (b == nullptr || *b) return "";
  return "false (bidirectional attention) is not implemented";
}

// A number the key may only carry with the value llama.cpp assumes for llama / qwen2 (it does not
// read these keys for them; the engine computes what llama.cpp computes, and refuses a file that
// means something else).
constexpr double kZero = 0.0;
constexpr double kOne = 1.0;
template <const double& kNeutral>
std::string CheckNeutral(const GgufFile& g, const std::string& key) {
  const auto v = g.GetFloat(key);
  if (!v || *v == kNeutral) return "";
  return "value " + std::to_string(*v) + " is not implemented (only " + std::to_string(kNeutral) +
         ", what llama.cpp computes with for this architecture)";
}

// The architecture a `{arch}.*` key belongs to.
std::string KeyArchitecture(const std::string& key) { return key.substr(0, key.find('.')); }

bool HasExperts(const std::string& arch) {
  return ParseArchitecture(arch) == Architecture::kQwen3Moe;
}

// Expert counts: read for qwen3moe (ModelConfig::Validate bounds them); a dense architecture may
// only say 0.
std::string CheckExpertCount(const GgufFile& g, const std::string& key) {
  if (HasExperts(KeyArchitecture(key))) return "";
  return CheckNeutral<kZero>(g, key);
}

// llama.cpp's qwen3moe always renormalises the chosen experts' weights and never scales them; a
// file may say so, not the opposite.
std::string CheckExpertWeightsNorm(const GgufFile& g, const std::string& key) {
  const auto* b = std::get_if<bool>(g.Find(key));
  if (b == nullptr || *b) return "";
  return "false (unnormalised expert weights) is not implemented";
}
std::string CheckExpertWeightsScale(const GgufFile& g, const std::string& key) {
  const auto v = g.GetFloat(key);
  if (!v || *v == 0.0 || *v == 1.0) return "";  // llama.cpp: 0 and 1 both mean "not scaled"
  return "value " + std::to_string(*v) + " is not implemented (only 0 or 1: unscaled)";
}
// llama_expert_gating_func_type: 0 none (the architecture's default), 1 softmax (qwen3moe's).
std::string CheckExpertGating(const GgufFile& g, const std::string& key) {
  const auto v = g.GetInt(key);
  if (!v || *v == 0 || *v == 1) return "";
  return "gating function " + std::to_string(*v) + " is not implemented (only 1, softmax)";
}
// Grouped expert selection (DeepSeek V3): llama.cpp applies it for any architecture above 1 group.
std::string CheckExpertGroups(const GgufFile& g, const std::string& key) {
  const auto v = g.GetInt(key);
  if (!v || *v <= 1) return "";
  return "value " + std::to_string(*v) + " (grouped expert selection) is not implemented";
}

std::string CheckValueLength(const GgufFile& g, const std::string& key) {
  const auto v = g.GetInt(key);
  const std::string arch = key.substr(0, key.find('.'));
  auto k = g.GetInt(arch + ".attention.key_length");
  if (!k) {
    const auto dim = g.GetInt(arch + ".embedding_length");
    const auto heads = g.GetInt(arch + ".attention.head_count");
    if (dim && heads && *heads > 0) k = *dim / *heads;
  }
  if (!v || !k || *v == *k) return "";
  return "value heads of " + std::to_string(*v) + " floats differ from key heads of " +
         std::to_string(*k) + ": not implemented";
}

std::string CheckPreTokenizer(const GgufFile& g, const std::string& key) {
  if (StringValue(g, "tokenizer.ggml.model") != "gpt2") return "";  // llama.cpp ignores it then
  const std::string p = StringValue(g, key);
  if (ParsePreTokenizer(p)) return "";
  return "pre-tokenizer " + Quoted(p) + " is not implemented (supported: " + PreTokenizerNames() +
         ")";
}

// SentencePiece vocabularies prefix text with a space (llama.cpp's default for them); a file that
// turns that off tokenizes differently.
std::string CheckSpacePrefix(const GgufFile& g, const std::string& key) {
  if (StringValue(g, "tokenizer.ggml.model") != "llama") return "";  // unused by gpt2
  const auto* b = std::get_if<bool>(g.Find(key));
  if (b == nullptr || *b) return "";
  return "false (no space prefix) is not implemented for SentencePiece vocabularies";
}

// The table. Keys under general.* and outside the architecture's and tokenizer.* namespaces are
// all harmless (names, licences, quantisation provenance) and need no row.
constexpr GgufKeyRule kRules[] = {
    {"general.architecture", KeyUse::kRead,
     "llama, qwen2, qwen3 or qwen3moe (ReadConfig refuses others)"},
    {"general.alignment", KeyUse::kRead, "tensor data alignment (the parser)"},
    {"{arch}.context_length", KeyUse::kRead, "trained context; YaRN's default original context"},
    {"{arch}.embedding_length", KeyUse::kRead, "residual width"},
    {"{arch}.block_count", KeyUse::kRead, "layers"},
    {"{arch}.feed_forward_length", KeyUse::kRead, "SwiGLU hidden width"},
    {"{arch}.attention.head_count", KeyUse::kRead, "query heads"},
    {"{arch}.attention.head_count_kv", KeyUse::kRead, "key/value heads (GQA)"},
    {"{arch}.attention.key_length", KeyUse::kRead, "head dim"},
    {"{arch}.attention.value_length", KeyUse::kRead, "must equal the head dim", CheckValueLength},
    {"{arch}.attention.layer_norm_rms_epsilon", KeyUse::kRead, "RMSNorm epsilon"},
    {"{arch}.rope.freq_base", KeyUse::kRead, "RoPE theta (default 10000)"},
    {"{arch}.rope.dimension_count", KeyUse::kRead, "rotated dims per head"},
    {"{arch}.rope.scaling.type", KeyUse::kRead, "none | linear | yarn", CheckRopeScaling},
    {"{arch}.rope.scaling.factor", KeyUse::kRead, "context scaling factor (linear, yarn)"},
    {"{arch}.rope.scale_linear", KeyUse::kRead, "older spelling of the factor"},
    {"{arch}.rope.scaling.original_context_length", KeyUse::kRead, "YaRN's original context"},
    {"{arch}.rope.scaling.attn_factor", KeyUse::kRead, "multiplies q and k at their position"},
    {"{arch}.rope.scaling.yarn_beta_fast", KeyUse::kRead, "YaRN beta_fast: only 32",
     CheckNeutral<kYarnBetaFast>},
    {"{arch}.rope.scaling.yarn_beta_slow", KeyUse::kRead, "YaRN beta_slow: only 1",
     CheckNeutral<kYarnBetaSlow>},
    {"{arch}.rope.scaling.yarn_ext_factor", KeyUse::kRead, "YaRN ramp weight: only 1",
     CheckNeutral<kOne>},
    {"{arch}.rope.scaling.yarn_attn_factor", KeyUse::kRead, "YaRN magnitude override: only 1",
     CheckNeutral<kOne>},
    {"{arch}.rope.scaling.yarn_log_multiplier", KeyUse::kRead, "DeepSeek-style mscale: only 0",
     CheckNeutral<kZero>},
    {"{arch}.attention.causal", KeyUse::kRead, "causal attention: only true", CheckCausal},
    {"{arch}.expert_count", KeyUse::kRead, "experts per layer (qwen3moe; others: only 0)",
     CheckExpertCount},
    {"{arch}.expert_used_count", KeyUse::kRead, "experts per token (qwen3moe; others: only 0)",
     CheckExpertCount},
    {"{arch}.expert_feed_forward_length", KeyUse::kRead, "an expert's SwiGLU hidden width"},
    {"{arch}.expert_shared_count", KeyUse::kRead, "shared experts: only 0", CheckNeutral<kZero>},
    {"{arch}.expert_shared_feed_forward_length", KeyUse::kRead, "shared experts: only 0",
     CheckNeutral<kZero>},
    {"{arch}.expert_weights_norm", KeyUse::kRead, "renormalised top-k weights: only true",
     CheckExpertWeightsNorm},
    {"{arch}.expert_weights_scale", KeyUse::kRead, "expert weight scale: only 0 or 1",
     CheckExpertWeightsScale},
    {"{arch}.expert_gating_func", KeyUse::kRead, "router gating: only softmax", CheckExpertGating},
    {"{arch}.expert_group_count", KeyUse::kRead, "grouped expert selection: only 0 or 1",
     CheckExpertGroups},
    {"{arch}.expert_group_used_count", KeyUse::kRead, "grouped expert selection: only 0 or 1",
     CheckExpertGroups},
    {"{arch}.vocab_size", KeyUse::kIgnored, "the token list and matrices give the vocabulary"},
    {"{arch}.rope.scaling.finetuned", KeyUse::kIgnored, "provenance flag"},
    {"{arch}.tensor_data_layout", KeyUse::kIgnored, "provenance of the q/k permutation"},
    {"{arch}.attention.layer_norm_epsilon", KeyUse::kIgnored, "unused by RMSNorm models"},
    {"tokenizer.ggml.model", KeyUse::kRead,
     "llama (SentencePiece) | gpt2 (byte-level BPE); the tokenizer reader refuses others"},
    {"tokenizer.ggml.pre", KeyUse::kRead, "gpt2 pre-tokenizer", CheckPreTokenizer},
    {"tokenizer.ggml.tokens", KeyUse::kRead, "token spellings"},
    {"tokenizer.ggml.scores", KeyUse::kRead, "SentencePiece merge scores"},
    {"tokenizer.ggml.token_type", KeyUse::kRead, "normal / control / user-defined / byte ..."},
    {"tokenizer.ggml.merges", KeyUse::kRead, "gpt2 merge ranks"},
    {"tokenizer.ggml.bos_token_id", KeyUse::kRead, "BOS"},
    {"tokenizer.ggml.eos_token_id", KeyUse::kRead, "EOS"},
    {"tokenizer.ggml.unknown_token_id", KeyUse::kRead, "UNK"},
    {"tokenizer.ggml.padding_token_id", KeyUse::kRead, "PAD"},
    {"tokenizer.ggml.add_bos_token", KeyUse::kRead, "prepend BOS to a prompt"},
    {"tokenizer.ggml.add_eos_token", KeyUse::kRead, "append EOS to a tokenized text"},
    {"tokenizer.ggml.add_space_prefix", KeyUse::kRead, "SentencePiece: only true",
     CheckSpacePrefix},
    {"tokenizer.ggml.eot_token_id", KeyUse::kIgnored, "end of turn (generation stops at EOS)"},
    {"tokenizer.ggml.eom_token_id", KeyUse::kIgnored, "end of message"},
    {"tokenizer.ggml.seperator_token_id", KeyUse::kIgnored, "separator (llama.cpp's spelling)"},
    {"tokenizer.ggml.cls_token_id", KeyUse::kIgnored, "classifier token"},
    {"tokenizer.ggml.mask_token_id", KeyUse::kIgnored, "mask token"},
    {"tokenizer.ggml.fim_pre_token_id", KeyUse::kIgnored, "fill-in-the-middle ids"},
    {"tokenizer.ggml.fim_suf_token_id", KeyUse::kIgnored, "fill-in-the-middle ids"},
    {"tokenizer.ggml.fim_mid_token_id", KeyUse::kIgnored, "fill-in-the-middle ids"},
    {"tokenizer.ggml.fim_pad_token_id", KeyUse::kIgnored, "fill-in-the-middle ids"},
    {"tokenizer.ggml.fim_rep_token_id", KeyUse::kIgnored, "fill-in-the-middle ids"},
    {"tokenizer.ggml.fim_sep_token_id", KeyUse::kIgnored, "fill-in-the-middle ids"},
    {"tokenizer.ggml.prefix_token_id", KeyUse::kIgnored, "older fill-in-the-middle ids"},
    {"tokenizer.ggml.suffix_token_id", KeyUse::kIgnored, "older fill-in-the-middle ids"},
    {"tokenizer.ggml.middle_token_id", KeyUse::kIgnored, "older fill-in-the-middle ids"},
    {"tokenizer.ggml.remove_extra_whitespaces", KeyUse::kIgnored, "used by llama.cpp's UGM only"},
    {"tokenizer.chat_template", KeyUse::kRead,
     "chat template: recognised as ChatML or Llama 3 for prompt.messages (chat_template.h)"},
    {"tokenizer.chat_template.*", KeyUse::kIgnored, "named chat templates"},
    {"tokenizer.huggingface.json", KeyUse::kIgnored, "the original tokenizer.json"},
};

// The rule for `key` in a file of architecture `arch`, or null.
const GgufKeyRule* FindRule(std::string_view key, std::string_view arch) {
  for (const GgufKeyRule& r : kRules) {
    std::string pattern(r.key);
    if (pattern.starts_with("{arch}.")) pattern = std::string(arch) + pattern.substr(6);
    if (pattern.ends_with(".*")) {
      if (key.starts_with(std::string_view(pattern).substr(0, pattern.size() - 1))) return &r;
    } else if (key == pattern) {
      return &r;
    }
  }
  return nullptr;
}

// Tensors an architecture may carry beyond RequiredTensors.
bool OptionalTensor(std::string_view name, std::string_view arch) {
  // llama.cpp loads rope_freqs for llama only; a qwen2 file with it would not load there either.
  return name == kRopeFreqsTensor && arch == "llama";
}

}  // namespace

std::span<const GgufKeyRule> GgufKeyRules() { return kRules; }

std::optional<RopeScaling> ParseRopeScaling(std::string_view name) {
  if (name == "none") return RopeScaling::kNone;
  if (name == "linear") return RopeScaling::kLinear;
  if (name == "yarn") return RopeScaling::kYarn;
  return std::nullopt;
}

std::vector<std::string> UnsupportedInGguf(const GgufFile& g, const ModelConfig* c) {
  std::vector<std::string> out;
  const std::string arch = StringValue(g, "general.architecture");
  for (const auto& [key, value] : g.metadata()) {
    const GgufKeyRule* rule = FindRule(key, arch);
    if (rule == nullptr) {
      const bool shapes_computation =
          (!arch.empty() && key.starts_with(arch + ".")) || key.starts_with("tokenizer.");
      if (shapes_computation) {
        out.push_back("metadata key " + Quoted(key) + " is not implemented by this engine");
      }
      continue;
    }
    if (rule->check == nullptr) continue;
    std::string why;
    try {
      why = rule->check(g, key);
    } catch (const LoadError& e) {
      why = e.what();  // a value of the wrong type
    }
    if (!why.empty()) out.push_back("metadata key " + Quoted(key) + ": " + why);
  }
  if (c != nullptr) {
    std::set<std::string, std::less<>> expected;
    for (const TensorSpec& t : RequiredTensors(*c)) expected.insert(t.name);
    for (const GgufTensorInfo& t : g.tensors()) {
      if (expected.contains(t.name) || OptionalTensor(t.name, arch)) continue;
      if (t.name.find("_shexp.") != std::string::npos) {
        out.push_back("tensor " + Quoted(t.name) + ": shared experts are not implemented");
        continue;
      }
      out.push_back("tensor " + Quoted(t.name) + " is not part of a " + arch +
                    " model this engine computes");
    }
  }
  return out;
}

void RequireSupportedGguf(const GgufFile& g, const ModelConfig& c) {
  const std::vector<std::string> problems = UnsupportedInGguf(g, &c);
  if (problems.empty()) return;
  std::string msg = g.source() + ": unsupported (the engine would compute something else):";
  for (const std::string& p : problems) msg += "\n  " + p;
  throw LoadError(msg);
}

}  // namespace metronome::model::internal
