// metronome export-gguf: write a model (e.g. a synthetic preset) as a standard GGUF file.
// metronome quantize: the same, with the matrices in a quantised type or llama.cpp-style mix.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::cli {
namespace {

struct ExportFlags {
  ModelFlags model;
  std::string out;
  std::string dtype = "f32";
  void Register(CLI::App* sub);
};

void ExportFlags::Register(CLI::App* sub) {
  model.Register(sub, true);
  sub->add_option("--out", out, "Output .gguf path")->required();
  sub->add_option("--dtype", dtype, "Matrix type: f32 | f16")->check(CLI::IsMember({"f32", "f16"}));
}

int RunExport(const ExportFlags& f) {
  const model::Model m = f.model.Load();
  model::ExportGguf(m, f.out, f.dtype == "f16" ? model::GgmlType::kF16 : model::GgmlType::kF32);
  std::printf("wrote %s (%s, %s)\n", f.out.c_str(), m.config.name.c_str(), f.dtype.c_str());
  return 0;
}

struct QuantizeFlags {
  ModelFlags model;
  std::string out;
  std::string type;
  void Register(CLI::App* sub);
};

void QuantizeFlags::Register(CLI::App* sub) {
  model.Register(sub, true);
  sub->add_option("--out", out, "Output .gguf path")->required();
  sub->add_option("--type", type, "Tensor types: " + model::ExportTypeNames())->required();
}

int RunQuantize(const QuantizeFlags& f) {
  const auto types = model::ParseExportTypes(f.type);
  if (!types) {
    throw ConfigError("--type: unknown type '" + f.type + "' (known: " + model::ExportTypeNames() +
                      ")");
  }
  const model::Model m = f.model.Load();
  const auto table = model::ExportGguf(m, f.out, *types);
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
  std::printf("wrote %s (%s, %s): %.2f MiB of tensors\n", f.out.c_str(), m.config.name.c_str(),
              f.type.c_str(), static_cast<double>(total) / (1 << 20));
  return 0;
}

}  // namespace

const AddCommandFlags kAddExportGgufFlags = &AddFlagsAndRun<ExportFlags, RunExport>;

const AddCommandFlags kAddQuantizeFlags = &AddFlagsAndRun<QuantizeFlags, RunQuantize>;

}  // namespace metronome::cli
