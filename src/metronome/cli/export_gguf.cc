// metronome export-gguf: write a model (e.g. a synthetic preset) as a standard GGUF file.
#include <cstdio>
#include <memory>

#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"

namespace metronome::cli {
namespace {

struct ExportFlags {
  ModelFlags model;
  std::string out;
  std::string dtype = "f32";
};

int RunExport(const ExportFlags& f) {
  const model::Model m = f.model.Load();
  model::ExportGguf(m, f.out, f.dtype == "f16" ? model::GgmlType::kF16 : model::GgmlType::kF32);
  std::printf("wrote %s (%s, %s)\n", f.out.c_str(), m.config.name.c_str(), f.dtype.c_str());
  return 0;
}

}  // namespace

void RegisterExportGguf(CLI::App* app, int* exit_code) {
  auto flags = std::make_shared<ExportFlags>();
  CLI::App* sub = app->add_subcommand(
      "export-gguf", "Write a model as GGUF (llama architecture, with vocabulary) for llama.cpp");
  flags->model.Register(sub, true);
  sub->add_option("--out", flags->out, "Output .gguf path")->required();
  sub->add_option("--dtype", flags->dtype, "Matrix type: f32 | f16")
      ->check(CLI::IsMember({"f32", "f16"}));
  sub->callback([flags, exit_code] { *exit_code = RunExport(*flags); });
}

}  // namespace metronome::cli
