// metronome export-gguf: write a model (e.g. a synthetic preset) as a standard GGUF file.
// metronome quantize: the same, with the matrices in a quantised type or llama.cpp-style mix.
// metronome synth-gguf: a synthetic preset's file as quantize writes it, without making the model.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::cli {
namespace {

// The model to write and the file to write it to: export-gguf's and quantize's common flags.
struct ModelToFileFlags {
  ModelFlags model;
  std::string out;
  void Register(CLI::App* sub) {
    model.Register(sub, /*required=*/true);
    sub->add_option("--out", out, "Output .gguf path")->required();
  }
};

struct ExportFlags {
  ModelToFileFlags io;
  std::string dtype = "f32";
  double rope_theta = 0.0;
  std::string rope_freqs;
  std::string rope_scaling;
  void Register(CLI::App* sub);
};

void ExportFlags::Register(CLI::App* sub) {
  io.Register(sub);
  sub->add_option("--dtype", dtype, "Matrix type: f32 | f16")->check(CLI::IsMember({"f32", "f16"}));
  sub->add_option("--rope-theta", rope_theta, "Write this RoPE base instead of the model's");
  sub->add_option("--rope-freqs", rope_freqs,
                  "Write rope_freqs.weight: 'llama3' (Llama 3.1's recipe: factor 8, low 1, "
                  "high 4, original context 8192)")
      ->check(CLI::IsMember({"llama3"}));
  sub->add_option("--rope-scaling", rope_scaling,
                  "Write rope.scaling.*: linear:FACTOR or yarn:FACTOR:ORIGINAL_CONTEXT");
}

// "linear:4" / "yarn:4:512" into the config's rope scaling; ConfigError naming the flag otherwise.
void ApplyRopeScaling(const std::string& spec, model::ModelConfig& c) {
  const auto fail = [&spec]() {
    return ConfigError("--rope-scaling: '" + spec +
                       "' is not linear:FACTOR or yarn:FACTOR:ORIGINAL_CONTEXT");
  };
  std::vector<std::string> parts(1);
  for (const char ch : spec) {
    if (ch == ':') {
      parts.emplace_back();
    } else {
      parts.back().push_back(ch);
    }
  }
  const bool yarn = parts[0] == "yarn";
  if (!(parts[0] == "linear" && parts.size() == 2) && !(yarn && parts.size() == 3)) throw fail();
  try {
    std::size_t used = 0;
    c.rope_scaling_factor = std::stod(parts[1], &used);
    if (used != parts[1].size()) throw fail();
    if (yarn) {
      c.rope_original_context = std::stoi(parts[2], &used);
      if (used != parts[2].size()) throw fail();
    }
  } catch (const std::logic_error&) {
    throw fail();
  }
  c.rope_scaling = yarn ? model::RopeScaling::kYarn : model::RopeScaling::kLinear;
}

int RunExport(const ExportFlags& f) {
  model::Model m = f.io.model.Load();
  if (f.rope_theta != 0.0) m.config.rope_theta = f.rope_theta;
  if (!f.rope_scaling.empty()) ApplyRopeScaling(f.rope_scaling, m.config);
  if (f.rope_freqs == "llama3") {
    m.config.rope_freq_factors = model::Llama3RopeFreqFactors(
        m.config.rope_theta, m.config.rotary_dim(), 8.0, 1.0, 4.0, 8192.0);
  }
  model::ExportGguf(m, f.io.out, f.dtype == "f16" ? model::GgmlType::kF16 : model::GgmlType::kF32);
  std::printf("wrote %s (%s, %s)\n", f.io.out.c_str(), m.config.name.c_str(), f.dtype.c_str());
  return 0;
}

struct QuantizeFlags {
  ModelToFileFlags io;
  std::string type;
  void Register(CLI::App* sub);
};

void QuantizeFlags::Register(CLI::App* sub) {
  io.Register(sub);
  sub->add_option("--type", type, "Tensor types: " + model::ExportTypeNames())->required();
}

// The --type mix, or a ConfigError naming the flag.
model::ExportTypes TypesFlag(const std::string& type) {
  const auto types = model::ParseExportTypes(type);
  if (!types) {
    throw ConfigError("--type: unknown type '" + type + "' (known: " + model::ExportTypeNames() +
                      ")");
  }
  return *types;
}

void PrintTable(const std::vector<model::ExportedTensor>& table, const std::string& out,
                const std::string& name, const std::string& type) {
  std::uint64_t total = 0;
  std::printf("%-28s %-14s %-6s %10s  %s\n", "tensor", "shape", "type", "bytes", "note");
  for (const auto& t : table) {
    std::string shape;
    for (const auto d : t.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    std::printf("%-28s %-14s %-6s %10llu  %s\n", t.name.c_str(), shape.c_str(),
                std::string(quant::Name(t.type)).c_str(), static_cast<unsigned long long>(t.bytes),
                t.reason.c_str());
    total += t.bytes;
  }
  std::printf("wrote %s (%s, %s): %.2f MiB of tensors\n", out.c_str(), name.c_str(), type.c_str(),
              static_cast<double>(total) / (1 << 20));
}

int RunQuantize(const QuantizeFlags& f) {
  const model::ExportTypes types = TypesFlag(f.type);
  const model::Model m = f.io.model.Load();
  PrintTable(model::ExportGguf(m, f.io.out, types), f.io.out, m.config.name, f.type);
  return 0;
}

struct SynthFlags {
  std::string shape;
  std::string out;
  std::string type = "q4_k_m";
  std::uint64_t seed = 1234;  // MakeSyntheticModel's default: the file equals quantize's
  int threads = 0;
  void Register(CLI::App* sub);
};

void SynthFlags::Register(CLI::App* sub) {
  sub->add_option("--shape", shape, "Synthetic preset: " + model::SyntheticPresetNames())
      ->required();
  sub->add_option("--out", out, "Output .gguf path")->required();
  sub->add_option("--type", type, "Tensor types: " + model::ExportTypeNames());
  sub->add_option("--seed", seed, "Weight seed (the default is synthetic:<preset>'s)");
  sub->add_option("--threads", threads, "Quantising threads (0: all cores)")
      ->check(CLI::Range(0, 4096));
}

int RunSynth(const SynthFlags& f) {
  const model::ExportTypes types = TypesFlag(f.type);
  PrintTable(model::WriteSyntheticGguf(f.shape, f.seed, f.out, types, f.threads), f.out,
             "synthetic:" + f.shape, f.type);
  return 0;
}

}  // namespace

const AddCommandFlags kAddExportGgufFlags = &AddFlagsAndRun<ExportFlags, RunExport>;

const AddCommandFlags kAddQuantizeFlags = &AddFlagsAndRun<QuantizeFlags, RunQuantize>;

const AddCommandFlags kAddSynthGgufFlags = &AddFlagsAndRun<SynthFlags, RunSynth>;

}  // namespace metronome::cli
