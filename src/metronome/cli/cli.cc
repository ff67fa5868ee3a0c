#include "metronome/cli/cli.h"

#include <CLI/CLI.hpp>
#include <array>
#include <cstdio>
#include <exception>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"

namespace metronome::cli {
namespace {

// The subcommands in the order `metronome --help` lists them: the name, its line in --help, and
// what adds its flags (each command's own file).
struct Command {
  const char* name;
  const char* description;
  const AddCommandFlags* add_flags;
};
const std::array<Command, 14> kCommands = {{
    {"demo", "Multi-session generation with full and windowed KV from one pool (default job)",
     &kAddDemoFlags},
    {"generate", "Generate tokens from a prompt (one session)", &kAddGenerateFlags},
    {"score", "Teacher-forced scoring: perplexity of a sequence", &kAddScoreFlags},
    {"bench-decode", "Decode throughput: N sessions at context C, K batched decode steps",
     &kAddBenchDecodeFlags},
    {"export-gguf",
     "Write a model as GGUF (llama, qwen3 or qwen3moe architecture, with vocabulary) for "
     "llama.cpp",
     &kAddExportGgufFlags},
    {"info",
     "Describe a model: architecture (llama, qwen2, qwen3 and qwen3moe run; others are "
     "named and refused), hyper-parameters, tensors (type, shape, bytes), vocabulary and "
     "special tokens",
     &kAddInfoFlags},
    {"tokenize", "Print the token ids of a text (BOS prepended when the model's convention is to)",
     &kAddTokenizeFlags},
    {"quantize",
     "Write any loadable model as GGUF with quantised matrices (norms stay F32; _m mixes give "
     "attn_v, ffn_down and output Q6_K; rows that are not whole blocks fall back to a "
     "32-element type or F16); prints the type chosen per tensor",
     &kAddQuantizeFlags},
    {"synth-gguf",
     "Write a synthetic preset (real shapes included: qwen3-8b, qwen3-30b-a3b, qwen3moe-mid) as "
     "quantize would, streaming: each tensor generated and quantised in row chunks, never the "
     "whole model in memory",
     &kAddSynthGgufFlags},
    {"calibrate",
     "Fit the simulator's step-time model t = c0 + c1 * batch_tokens + c2 * visible_kv_tokens "
     "to timed steps of the real engine over a grid of batch sizes, contexts and chunk sizes",
     &kAddCalibrateFlags},
    {"sim",
     "Simulate real-time sessions on a virtual clock: the real scheduler, KV pool, admission "
     "and telemetry, with a cost model of one GPU for the step time",
     &kAddSimFlags},
    {"drive",
     "Run real-time sessions on the real engine and clock, in-process: same workload flags, "
     "scheduler, admission and telemetry as sim",
     &kAddDriveFlags},
    {"serve",
     "Serve real-time sessions over WebSocket (docs/protocol.md) on the real engine, with "
     "/metrics, /healthz, /v1/stats and a live dashboard at /",
     &kAddServeFlags},
    {"loadgen",
     "Drive a running `metronome serve` with paced real-time sessions over WebSocket (the "
     "workload flags of sim and drive), measuring every frame on the client side",
     &kAddLoadgenFlags},
}};

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"metronome: a serving engine for real-time interaction models"};
  app.require_subcommand(1);
  int exit_code = 0;
  for (const Command& command : kCommands) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    sub->callback([run = (*command.add_flags)(sub), &exit_code] { exit_code = run(); });
  }
  RequireFiniteNumbers(&app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and friends are ParseErrors with exit code 0. Every real one (unknown flag, a value
    // CLI11 cannot convert or a validator refuses) is a bad flag like a ConfigError: one line, 2.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const LoadError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 2;
  }
  return exit_code;
}

}  // namespace metronome::cli
