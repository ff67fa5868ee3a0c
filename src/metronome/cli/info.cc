// metronome info: what a model file holds (architecture, hyper-parameters, tensors with their
// types, shapes and bytes, vocabulary and special tokens), as a table or as JSON; with
// --check-weights also every weight decoded and checked for NaN and infinities (exit status 3
// when any tensor holds one: such a model would answer garbage or fail every session).
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/model/gguf.h"
#include "metronome/model/model_config_json.h"
#include "metronome/model/model_info.h"

namespace metronome::cli {
namespace {

struct InfoFlags {
  ModelFlags model;
  bool json = false;
  bool check_weights = false;
  void Register(CLI::App* sub);
};

void InfoFlags::Register(CLI::App* sub) {
  model.Register(sub, true);
  sub->add_flag("--json", json, "Print one JSON object instead of the table");
  sub->add_flag("--check-weights", check_weights,
                "Also decode every tensor (block by block) and report those holding NaN or "
                "infinite values: name, count, first element index; exit status 3 when any does");
}

const char* RopeStyleName(model::RopeStyle s) {
  return s == model::RopeStyle::kNeox ? "neox" : "interleaved";
}

const char* RopeScalingName(model::RopeScaling s) {
  switch (s) {
    case model::RopeScaling::kLinear:
      return "linear";
    case model::RopeScaling::kYarn:
      return "yarn";
    case model::RopeScaling::kNone:
      break;
  }
  return "none";
}

// "none", "linear x4", "yarn x4 from 512", plus ", rope_freqs (64)" and the attention factor.
std::string RopeVariant(const model::ModelConfig& c) {
  std::string s = RopeScalingName(c.rope_scaling);
  if (c.rope_scaling != model::RopeScaling::kNone) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " x%g", c.rope_scaling_factor);
    s += buf;
    if (c.rope_scaling == model::RopeScaling::kYarn) {
      s += " from " + std::to_string(c.yarn_original_context());
    }
  }
  if (!c.rope_freq_factors.empty()) {
    s += ", rope_freqs (" + std::to_string(c.rope_freq_factors.size()) + ")";
  }
  if (c.rope_attn_factor != 1.0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, ", attn factor %g", c.rope_attn_factor);
    s += buf;
  }
  return s;
}

nlohmann::json ConfigJson(const model::ModelConfig& c) {
  nlohmann::json j = c;  // the fields under their own names, then the derived ones
  j["rope_dim"] = c.rotary_dim();
  j["rope_style"] = RopeStyleName(c.rope_style);
  j["rope_scaling"] = RopeScalingName(c.rope_scaling);
  j["rope_scaling_factor"] = c.rope_scaling_factor;
  if (c.rope_scaling == model::RopeScaling::kYarn) {
    j["yarn_original_context"] = c.yarn_original_context();
  }
  j["rope_attn_factor"] = c.rope_attn_factor;
  j["rope_freq_factors"] = c.rope_freq_factors;
  j["qkv_bias"] = c.has_qkv_bias;
  return j;
}

nlohmann::json WeightCheckJson(const model::WeightCheck& check) {
  nlohmann::json bad = nlohmann::json::array();
  for (const model::NonFiniteTensor& t : check.non_finite) {
    bad.push_back({{"name", t.name}, {"count", t.count}, {"first_index", t.first_index}});
  }
  return {{"tensors_checked", check.tensors_checked},
          {"elements_checked", check.elements_checked},
          {"unchecked", check.unchecked},
          {"non_finite", bad}};
}

void PrintWeightCheck(const model::WeightCheck& check) {
  const std::string verdict = check.non_finite.empty() ? std::string("all finite")
                                                       : std::to_string(check.non_finite.size()) +
                                                             " tensors hold NaN or infinite values";
  std::printf("\nweights check  %" PRIu64 " tensors, %" PRIu64 " elements decoded: %s\n",
              check.tensors_checked, check.elements_checked, verdict.c_str());
  for (const model::NonFiniteTensor& t : check.non_finite) {
    std::printf("  non-finite   %s: %" PRIu64 " values, first at element %" PRIu64 "\n",
                t.name.c_str(), t.count, t.first_index);
  }
  for (const std::string& u : check.unchecked) {
    std::printf("  unchecked    %s: no decoder for this type\n", u.c_str());
  }
}

void PrintJson(const std::string& spec, const model::ModelInfo& info,
               const std::optional<model::WeightCheck>& check) {
  nlohmann::json j;
  j["model"] = spec;
  j["format"] = model::ToString(info.format);
  j["architecture"] = info.architecture;
  if (info.format == model::ModelFormat::kGguf) {
    j["gguf_version"] = info.gguf_version;
    j["metadata_entries"] = info.metadata_entries;
  }
  j["config"] = info.config ? ConfigJson(*info.config) : nlohmann::json(nullptr);
  if (!info.config_error.empty()) j["config_error"] = info.config_error;
  j["unsupported"] = info.unsupported;
  j["tokenizer"] = {{"kind", info.tokenizer_kind},
                    {"vocab_size", info.vocab_size},
                    {"adds_bos", info.adds_bos},
                    {"adds_eos", info.adds_eos},
                    {"chat_format", info.chat_format}};
  if (!info.pre_tokenizer.empty()) j["tokenizer"]["pre_tokenizer"] = info.pre_tokenizer;
  for (const model::SpecialToken& t : info.special_tokens) {
    j["tokenizer"]["special_tokens"][t.role] =
        t.id >= 0 ? nlohmann::json{{"id", t.id}, {"piece", t.piece}} : nlohmann::json(nullptr);
  }
  j["tensor_count"] = info.tensors.size();
  j["tensor_bytes"] = info.tensor_bytes;
  nlohmann::json tensors = nlohmann::json::array();
  for (const model::TensorSummary& t : info.tensors) {
    tensors.push_back({{"name", t.name},
                       {"type", std::string(quant::Name(t.type))},
                       {"computable", quant::Traits(t.type).computable},
                       {"shape", t.shape},
                       {"bytes", t.bytes}});
    if (info.format == model::ModelFormat::kGguf) tensors.back()["file_offset"] = t.file_offset;
  }
  j["tensors"] = tensors;
  if (check) j["weights_check"] = WeightCheckJson(*check);
  // Invalid UTF-8 in a hostile vocabulary is replaced, not thrown.
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

void PrintTable(const std::string& spec, const model::ModelInfo& info) {
  std::printf("model          %s\n", spec.c_str());
  std::printf("format         %s", model::ToString(info.format));
  if (info.format == model::ModelFormat::kGguf) {
    std::printf(" v%u, %" PRIu64 " metadata entries", info.gguf_version, info.metadata_entries);
  }
  std::printf("\narchitecture   %s\n", info.architecture.empty() ? "?" : info.architecture.c_str());
  if (info.config) {
    const model::ModelConfig& c = *info.config;
    std::printf(
        "hyper-params   dim %d, layers %d, heads %d, kv heads %d, head dim %d, ffn %d, vocab %d,"
        " context %d\n               rms eps %g, rope theta %g, rope dims %d (%s), qkv bias %s,"
        " tied embeddings %s\nrope scaling   %s\n",
        c.dim, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size,
        c.context_length, static_cast<double>(c.rms_eps), c.rope_theta, c.rotary_dim(),
        RopeStyleName(c.rope_style), c.has_qkv_bias ? "yes" : "no",
        c.tied_embeddings ? "yes" : "no", RopeVariant(c).c_str());
    if (c.has_qk_norm) std::printf("q/k norms      per head, before RoPE\n");
    if (c.is_moe()) {
      std::printf("experts        %d per layer, %d per token, ffn %d each\n", c.num_experts,
                  c.num_experts_used, c.expert_ffn_dim);
    }
  } else {
    std::printf("hyper-params   unavailable: %s\n", info.config_error.c_str());
  }
  if (info.unsupported.empty()) {
    std::printf("supported      yes\n");
  } else {
    std::printf("supported      NO: the engine refuses to load this file\n");
    for (const std::string& u : info.unsupported) std::printf("  unsupported  %s\n", u.c_str());
  }
  std::printf("tokenizer      %s%s%s, %d tokens, BOS prepended to prompts: %s%s\n",
              info.tokenizer_kind.c_str(), info.pre_tokenizer.empty() ? "" : " pre ",
              info.pre_tokenizer.c_str(), info.vocab_size, info.adds_bos ? "yes" : "no",
              info.adds_eos ? ", EOS appended" : "");
  if (info.chat_format != "none") {
    std::printf("chat template  %s%s\n", info.chat_format.c_str(),
                info.chat_format == "unrecognised" ? " (prompt.messages refused)" : "");
  }
  std::printf("special tokens");
  for (const model::SpecialToken& t : info.special_tokens) {
    if (t.id >= 0) {
      std::printf(" %s %d '%s';", t.role.c_str(), t.id, t.piece.c_str());
    } else {
      std::printf(" %s none;", t.role.c_str());
    }
  }
  std::printf("\ntensors        %zu, %" PRIu64 " bytes (%s)\n", info.tensors.size(),
              info.tensor_bytes, HumanBytes(static_cast<double>(info.tensor_bytes)).c_str());
  std::size_t name_width = 4;
  for (const model::TensorSummary& t : info.tensors)
    name_width = std::max(name_width, t.name.size());
  const int w = static_cast<int>(name_width);
  std::printf("\n%-*s  %-8s  %-20s  %12s\n", w, "name", "type", "shape", "bytes");
  for (const model::TensorSummary& t : info.tensors) {
    const bool computable = quant::Traits(t.type).computable;
    std::printf("%-*s  %-8s  %-20s  %12" PRIu64 "%s\n", w, t.name.c_str(),
                std::string(quant::Name(t.type)).c_str(), model::ShapeString(t.shape).c_str(),
                t.bytes, computable ? "" : "  (type not computable by this engine yet)");
  }
}

int RunInfo(const InfoFlags& f) {
  const model::ModelInfo info = model::DescribeModel(f.model.model, f.model.tokenizer);
  std::optional<model::WeightCheck> check;
  if (f.check_weights) check = model::CheckWeights(f.model.model, f.model.tokenizer);
  if (f.json) {
    PrintJson(f.model.model, info, check);
  } else {
    PrintTable(f.model.model, info);
    if (check) PrintWeightCheck(*check);
  }
  if (check && !check->non_finite.empty()) {
    std::fprintf(stderr, "error: %zu tensors hold NaN or infinite values (first: %s)\n",
                 check->non_finite.size(), check->non_finite.front().name.c_str());
    return 3;
  }
  return 0;
}

}  // namespace

const AddCommandFlags kAddInfoFlags = &AddFlagsAndRun<InfoFlags, RunInfo>;

}  // namespace metronome::cli
