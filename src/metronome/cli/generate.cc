// metronome generate: one session, prompt then N sampled tokens.
#include <chrono>
#include <cstdio>
#include <memory>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/engine/feed.h"
#include "metronome/engine/sampler.h"

namespace metronome::cli {
namespace {

struct GenerateFlags {
  ModelFlags model;
  KvFlags kv;
  EngineFlags engine;
  std::string prompt;
  std::string prompt_ids;
  int steps = 64;
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::uint64_t seed = 42;
  int chunk = 256;
  bool print_ids = false;
  bool stop_at_eos = false;
  void Register(CLI::App* sub);
};

void GenerateFlags::Register(CLI::App* sub) {
  model.Register(sub, true);
  kv.Register(sub);
  engine.Register(sub);
  auto* p =
      sub->add_option("--prompt", prompt,
                      "Prompt text (BOS prepended by the model's convention, as `tokenize` shows)");
  auto* pi = sub->add_option("--prompt-ids", prompt_ids, "Prompt as token ids, e.g. \"1 2 3\"");
  p->excludes(pi);
  sub->add_option("--steps", steps, "Tokens to generate")->check(CLI::Range(0, 1 << 24));
  sub->add_option("--temperature", temperature, "0: greedy")->check(CLI::Range(0.0f, 100.0f));
  sub->add_option("--top-p", top_p, "Nucleus sampling threshold")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--seed", seed, "Sampling seed");
  sub->add_option("--chunk", chunk, "Prefill chunk size in tokens")->check(CLI::Range(1, 1 << 20));
  sub->add_flag("--print-ids", print_ids,
                "Print only the generated ids, space-separated, on one line");
  sub->add_flag("--stop-at-eos", stop_at_eos, "Stop when the tokenizer's EOS is generated");
}

int RunGenerate(const GenerateFlags& f) {
  const model::Model m = f.model.Load();
  std::vector<TokenId> prompt;
  if (!f.prompt_ids.empty()) {
    prompt = ParseIds(f.prompt_ids, m.config.vocab_size, "--prompt-ids");
  } else {
    if (m.tokenizer == nullptr) {
      throw ConfigError("--prompt needs a tokenizer: pass --tokenizer or use --prompt-ids");
    }
    prompt = m.tokenizer->Encode(f.prompt, m.tokenizer->adds_bos());
  }
  if (prompt.empty()) throw ConfigError("the prompt is empty (give --prompt or --prompt-ids)");

  const kv::KvPolicy policy = f.kv.Policy();
  engine::Engine eng(
      m, f.engine.Options(m.config, policy, 1, static_cast<std::int64_t>(prompt.size()) + f.steps,
                          f.chunk));
  std::fprintf(stderr, "[generate] %s\n", f.engine.ThreadsLine().c_str());
  engine::SessionOptions so;
  so.policy = policy;
  so.max_context = f.kv.max_context;
  const engine::SessionId sid = eng.OpenSession(so);
  engine::Sampler sampler({f.temperature, f.top_p, f.seed});

  const auto t0 = std::chrono::steady_clock::now();
  TokenId next = -1;
  engine::StepStatus st = engine::Feed(
      eng, sid, prompt, f.chunk, false,
      [&](std::size_t, std::span<const float> logits) { next = sampler.Sample(logits); });
  const auto t_prefill = std::chrono::steady_clock::now();
  std::vector<TokenId> generated;
  while (st == engine::StepStatus::kOk && static_cast<int>(generated.size()) < f.steps) {
    generated.push_back(next);
    if (f.stop_at_eos && m.tokenizer != nullptr && next == m.tokenizer->eos_id()) break;
    if (static_cast<int>(generated.size()) == f.steps) break;
    const TokenId in = next;
    st = engine::Feed(
        eng, sid, {&in, 1}, 1, false,
        [&](std::size_t, std::span<const float> logits) { next = sampler.Sample(logits); });
  }
  const auto t1 = std::chrono::steady_clock::now();

  if (f.print_ids) {
    for (std::size_t i = 0; i < generated.size(); ++i) {
      std::printf(i == 0 ? "%d" : " %d", generated[i]);
    }
    std::printf("\n");
  } else if (m.tokenizer != nullptr) {
    std::vector<TokenId> all = prompt;
    all.insert(all.end(), generated.begin(), generated.end());
    std::printf("%s\n", m.tokenizer->Decode(all).c_str());
  } else {
    for (std::size_t i = 0; i < generated.size(); ++i) {
      std::printf(i == 0 ? "%d" : " %d", generated[i]);
    }
    std::printf("\n");
  }
  const kv::SessionKvStats ks = eng.session_kv(sid)->stats();
  const double decode_s = std::chrono::duration<double>(t1 - t_prefill).count();
  std::fprintf(stderr,
               "[generate] prompt %zu tokens in %.1f ms; %zu tokens in %.1f ms (%.1f tok/s); "
               "kv %s: resident %lld blocks (%s), freed by window %lld\n",
               prompt.size(), std::chrono::duration<double, std::milli>(t_prefill - t0).count(),
               generated.size(), decode_s * 1e3,
               decode_s > 0 ? static_cast<double>(generated.size()) / decode_s : 0.0,
               policy.ToString().c_str(), static_cast<long long>(ks.resident_blocks),
               HumanBytes(static_cast<double>(ks.resident_blocks) *
                          static_cast<double>(eng.kv_layout().bytes_per_block()))
                   .c_str(),
               static_cast<long long>(ks.blocks_freed_by_window));
  if (st != engine::StepStatus::kOk) {
    std::fprintf(stderr, "error: generation stopped after %zu tokens: %s\n", generated.size(),
                 DescribeStepFailure(st).c_str());
    return 3;
  }
  return 0;
}

}  // namespace

const AddCommandFlags kAddGenerateFlags = &AddFlagsAndRun<GenerateFlags, RunGenerate>;

}  // namespace metronome::cli
