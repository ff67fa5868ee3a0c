#include "metronome/realtime/presets.h"

#include <cmath>
#include <string>
#include <utility>

#include "metronome/base/errors.h"

namespace metronome::realtime {
namespace {

// One H200: 141 GB HBM3e at 4.8 TB/s. The KV pool is 60% of HBM (84.6 GB) unless a preset says
// otherwise, the convention of ../shared/notes/workloads.md.
constexpr double kH200PoolBytes = 0.6 * 141e9;

// The `assumed` notes are long sentences split over adjacent string literals on purpose.
// NOLINTBEGIN(bugprone-suspicious-missing-comma)

// Moshi 7B (kyutai): temporal transformer 32 layers x 32 KV heads x head_dim 128, bf16 =
// 524,288 B per position, one position per 80 ms frame (Mimi 12.5 Hz).
SimPreset Moshi7b() {
  return {
      .name = "moshi-7b",
      .description = "Moshi 7B full-duplex speech, 80 ms frames (12.5 Hz), one position per frame",
      .period_ms = 80.0,
      .tokens_per_frame = 1,
      .output_tokens_per_frame = 1,
      .kv_bytes_per_token = 262144.0,
      .pool_bytes = kH200PoolBytes,
      .cost = {.c0_s = 0.008, .c1_s_per_token = 1.0e-4, .c2_s_per_kv_token = 27.5e-9},
      .window_tokens = 1000,
      .sinks = 4,
      .assumed =
          {
              "kv_bytes_per_token: Moshi sums the user's and its own streams into one 512 KiB "
              "position per frame; the loop appends an input and an output token per frame, so "
              "each is modelled as half a position (256 KiB): bytes per frame stay exact",
              "pool_bytes: 60% of 141 GB",
              "c0 = 8 ms: weights 15.4 GB at 4.8 TB/s (3.2 ms) plus 8 depformer sub-steps and "
              "launch overhead; no published per-step time",
              "c1 = 0.1 ms per token: serving-stack throughput of ~10k tokens/s for a 7B model",
              "c2 = 27.5 ns per (query, key): a full 240 s ring (6000 tokens, 2 queries) costs "
              "0.33 ms per session per frame, the bandwidth roofline of the note",
              "window 1000 tokens (40 s) + 4 sinks: Metronome's choice; Moshi's own ring is 3000 "
              "positions (240 s)",
          },
  };
}

// Qwen2.5-Omni-7B thinker: 28 layers x 4 KV heads x 128, bf16 = 57,344 B per token. The audio
// encoder works in 2 s blocks of 50 tokens (25/s).
SimPreset Qwen25Omni7b() {
  return {
      .name = "qwen25-omni-7b",
      .description = "Qwen2.5-Omni-7B thinker, 2 s audio blocks (50 audio + ~4 text tokens)",
      .period_ms = 2000.0,
      .tokens_per_frame = 50,
      .output_tokens_per_frame = 4,
      .kv_bytes_per_token = 57344.0,
      .pool_bytes = kH200PoolBytes,
      .cost = {.c0_s = 0.006, .c1_s_per_token = 3.0e-5, .c2_s_per_kv_token = 2.0e-9},
      .window_tokens = 8192,
      .sinks = 4,
      .assumed =
          {
              "output_tokens_per_frame = 4: ~3.5 text tokens/s of speech at a 50% speaking duty "
              "cycle over a 2 s block, rounded up",
              "talker KV (which mirrors the thinker's context) is not modelled: thinker only",
              "pool_bytes: 60% of 141 GB",
              "c0 = 6 ms: 15 GB of weights at 4.8 TB/s plus overhead",
              "c1 = 30 us per token: ~15 GFLOP per token at ~500 TFLOP/s effective",
              "c2 = 2 ns per (query, key): 4 x 28 layers x 28 heads x 128 FLOP at ~200 TFLOP/s",
              "window 8192 tokens + 4 sinks: Metronome's choice (the model has no bound)",
          },
  };
}

// MiniCPM-o 4.5 (LLM = Qwen3-8B): 36 layers x 8 KV heads x 128, bf16 = 147,456 B per token.
// 1 s units: <unit>, 10 audio tokens, then a listen/speak decision.
SimPreset MiniCpmO45() {
  return {
      .name = "minicpm-o-4.5",
      .description = "MiniCPM-o 4.5 duplex audio, 1 s units (<unit> + 10 audio in, ~3 out)",
      .period_ms = 1000.0,
      .tokens_per_frame = 11,
      .output_tokens_per_frame = 3,
      .kv_bytes_per_token = 147456.0,
      .pool_bytes = kH200PoolBytes,
      .cost = {.c0_s = 0.006, .c1_s_per_token = 3.0e-5, .c2_s_per_kv_token = 4.0e-9},
      .window_tokens = 6000,
      .sinks = 4,
      .assumed =
          {
              "output_tokens_per_frame = 3: a listen token, or text plus chunk_eos (audio only, no "
              "video)",
              "pool_bytes: 60% of 141 GB",
              "c0 = 6 ms: 16 GB of weights at 4.8 TB/s plus overhead",
              "c1 = 30 us per token: ~16 GFLOP per token at ~500 TFLOP/s effective",
              "c2 = 4 ns per (query, key): 4 x 36 layers x 32 heads x 128 FLOP at ~150 TFLOP/s",
              "window 6000 tokens + 4 sinks: what the model's opt-in `basic` sliding mode keeps",
          },
  };
}

// Qwen3-Omni-30B-A3B thinker: 48 layers x 4 KV heads x 128, bf16 = 98,304 B per token; MoE with
// 3B active parameters of ~30B.
SimPreset Qwen3Omni30bA3b() {
  return {
      .name = "qwen3-omni-30b-a3b",
      .description = "Qwen3-Omni-30B-A3B thinker (MoE), 1 s chunks (13 audio + ~2 text tokens)",
      .period_ms = 1000.0,
      .tokens_per_frame = 13,
      .output_tokens_per_frame = 2,
      .kv_bytes_per_token = 98304.0,
      .pool_bytes = 0.45 * 141e9,
      .cost = {.c0_s = 0.015, .c1_s_per_token = 2.0e-5, .c2_s_per_kv_token = 3.0e-9},
      .window_tokens = 8192,
      .sinks = 4,
      .assumed =
          {
              "period_ms = 1000: a deployment choice (the reference processor uses 2 s chunks)",
              "output_tokens_per_frame = 2: ~3.5 text tokens/s at a 50% speaking duty cycle",
              "pool_bytes: 45% of 141 GB (the weights take ~70 GB)",
              "c0 = 15 ms: a large batch touches every expert, ~70 GB of weights at 4.8 TB/s",
              "c1 = 20 us per token: 3B active parameters plus MoE routing overhead",
              "c2 = 3 ns per (query, key): 4 x 48 layers x 32 heads x 128 FLOP at ~250 TFLOP/s",
              "window 8192 tokens + 4 sinks: Metronome's choice (max_model_len is 32768)",
          },
  };
}

// The CPU siblings of the two Qwen3 backbones: the same session shape as the GPU presets, the
// cost fitted on the real engine over a real-size random-weight Q4_K_M file of the backbone
// (`metronome synth-gguf --shape <backbone> --type q4_k_m`), the KV bytes of the engine's bf16
// KV, and a pool of what a 24 GiB host keeps after the weights.
struct CpuCalibration {
  std::string name;
  std::string description;
  std::string backbone;       // the synth-gguf shape the cost was fitted on
  double file_gib = 0.0;      // that file's size
  int layers = 0;             // c2 is per (query, key) over all of them
  std::string grid;           // `metronome calibrate` flags past --model and --threads 1
  CostModel cost;             // the fit
  double resident_gib = 0.0;  // the engine's resident weights
  double pool_bytes = 0.0;
};

SimPreset OnThisCpu(SimPreset gpu, const CpuCalibration& c) {
  SimPreset p = std::move(gpu);
  const std::string gpu_name = p.name;
  p.name = c.name;
  p.description = c.description;
  p.pool_bytes = c.pool_bytes;
  p.cost = c.cost;
  p.assumed = {
      "c0, c1, c2: calibrated with `metronome calibrate --model " + c.backbone +
          "-q4_k_m.gguf --threads 1 " + c.grid + "` on the file `metronome synth-gguf --shape " +
          c.backbone + " --type q4_k_m` writes (random weights, the real shape, " +
          FormatValue(c.file_gib) + " GiB); c2 is per (query, key) over all " +
          std::to_string(c.layers) + " layers, one core's attention",
      "pool_bytes: " + FormatValue(c.pool_bytes / 1e9) + " GB, what a 24 GiB host keeps after " +
          FormatValue(c.resident_gib) + " GiB of resident weights and room for the system",
      "period_ms = " + FormatValue(p.period_ms) +
          ", output_tokens_per_frame = " + std::to_string(p.output_tokens_per_frame) + ", window " +
          std::to_string(p.window_tokens) + " tokens + " + std::to_string(p.sinks) + " sinks: as " +
          gpu_name,
  };
  return p;
}

// MiniCPM-o 4.5's backbone (Qwen3-8B, 36 layers x 8 KV heads x 128, bf16 KV) on the CPU.
SimPreset MiniCpmO45Cpu() {
  return OnThisCpu(
      MiniCpmO45(),
      {.name = "minicpm-o-4.5-cpu",
       .description =
           "MiniCPM-o 4.5's Qwen3-8B backbone on this CPU (Q4_K_M, calibrated), 1 s units",
       .backbone = "qwen3-8b",
       .file_gib = 4.9,
       .layers = 36,
       .grid = "--kv window --window 6000 --batch-sessions 1,2 --contexts 16,384 "
               "--chunk-tokens 1,11 --repeats 3",
       .cost = {.c0_s = 0.311, .c1_s_per_token = 53.3e-3, .c2_s_per_kv_token = 6.71e-6},
       .resident_gib = 5.4,
       .pool_bytes = 12e9});
}

// Qwen3-Omni-30B-A3B's thinker backbone (Qwen3-30B-A3B, 48 layers x 4 KV heads x 128, bf16 KV).
SimPreset Qwen3Omni30bA3bCpu() {
  return OnThisCpu(
      Qwen3Omni30bA3b(),
      {.name = "qwen3-omni-30b-a3b-cpu",
       .description =
           "Qwen3-Omni-30B-A3B's thinker backbone on this CPU (Q4_K_M, calibrated), 1 s chunks",
       .backbone = "qwen3-30b-a3b",
       .file_gib = 18.4,
       .layers = 48,
       .grid = "--kv window --window 8192 --batch-sessions 1,2 --contexts 64,256 "
               "--chunk-tokens 1,13 --repeats 3",
       .cost = {.c0_s = 0.143, .c1_s_per_token = 38.2e-3, .c2_s_per_kv_token = 25.1e-6},
       .resident_gib = 18.8,
       .pool_bytes = 2e9});
}

std::vector<SimPreset> MakePresets() {
  return {Moshi7b(),         Qwen25Omni7b(),  MiniCpmO45(),
          Qwen3Omni30bA3b(), MiniCpmO45Cpu(), Qwen3Omni30bA3bCpu()};
}
// NOLINTEND(bugprone-suspicious-missing-comma)

}  // namespace

std::int64_t SimPreset::PoolBlocks() const {
  return static_cast<std::int64_t>(
      std::floor(pool_bytes / (kv_bytes_per_token * static_cast<double>(block_tokens))));
}

const std::vector<SimPreset>& BuiltinPresets() {
  static const std::vector<SimPreset> presets = MakePresets();
  return presets;
}

const SimPreset& FindPreset(const std::string& name) {
  std::string names;
  for (const SimPreset& p : BuiltinPresets()) {
    if (p.name == name) return p;
    names += names.empty() ? p.name : ", " + p.name;
  }
  throw ConfigError("preset = '" + name + "' is not a built-in preset (one of: " + names + ")");
}

}  // namespace metronome::realtime
