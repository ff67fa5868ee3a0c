// metronome demo: the README's main job for now. Several sessions, some with full KV and some with
// a window + sinks bound, generate together in batched steps from one small pool; prints each
// session's output, the throughput and how the pool was used.
#include <chrono>
#include <cstdio>
#include <memory>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/engine/sampler.h"

namespace metronome::cli {
namespace {

struct DemoFlags {
  ModelFlags model;
  EngineFlags engine;
  int sessions = 6;
  int steps = 96;
  std::int64_t window = 32;
  std::int64_t sinks = 4;
  std::int64_t kv_blocks_demo = 0;
  float temperature = 0.8f;
  std::uint64_t seed = 1;
  DemoFlags() { model.model = "synthetic:small"; }  // demo's own default model
  void Register(CLI::App* sub);
};

void DemoFlags::Register(CLI::App* sub) {
  model.Register(sub, false);
  engine.Register(sub);
  sub->add_option("--sessions", sessions, "Sessions")->check(CLI::Range(1, 10000));
  sub->add_option("--steps", steps, "Decode steps")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--window", window, "W of the windowed sessions")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  sub->add_option("--sinks", sinks, "S of the windowed sessions")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 30));
  sub->add_option("--temperature", temperature, "Sampling temperature (0: greedy)")
      ->check(CLI::Range(0.0f, 100.0f));
  sub->add_option("--seed", seed, "Sampling seed");
}

const char* const kPrompts[] = {"Once upon a time", "The little dog",  "One day, Lily",
                                "The sun was",      "Tom and his mom", "In the park",
                                "A big red ball",   "The cat said"};

// One demo session: its KV policy, the tokens so far (prompt first) and its sampler.
struct DemoSession {
  DemoSession(engine::SessionId sid, const kv::KvPolicy& pol, const engine::SamplerOptions& so)
      : id(sid), policy(pol), sampler(so) {}
  engine::SessionId id;
  kv::KvPolicy policy;
  std::vector<TokenId> tokens;
  std::size_t prompt_len = 0;
  TokenId next = -1;
  std::string stopped;  // why the engine stopped it (empty: running)
  engine::Sampler sampler;
};

// Opens f.sessions sessions, even ones with full KV and odd ones with `window_policy`, each with
// one of kPrompts.
std::vector<std::unique_ptr<DemoSession>> OpenSessions(engine::Engine& eng, const model::Model& m,
                                                       const DemoFlags& f,
                                                       const kv::KvPolicy& window_policy) {
  std::vector<std::unique_ptr<DemoSession>> ss;
  for (int i = 0; i < f.sessions; ++i) {
    const kv::KvPolicy pol = i % 2 == 0 ? kv::KvPolicy::Full() : window_policy;
    engine::SessionOptions so;
    so.policy = pol;
    auto s = std::make_unique<DemoSession>(
        eng.OpenSession(so), pol,
        engine::SamplerOptions{f.temperature, 0.95f, f.seed + static_cast<std::uint64_t>(i)});
    const std::string prompt = kPrompts[static_cast<std::size_t>(i) % std::size(kPrompts)];
    s->tokens = m.tokenizer != nullptr ? m.tokenizer->Encode(prompt, m.tokenizer->adds_bos())
                                       : std::vector<TokenId>{1};
    s->prompt_len = s->tokens.size();
    ss.push_back(std::move(s));
  }
  return ss;
}

// The prompts, then `steps` sampled tokens, every running session in each batched step; returns
// the tokens forwarded.
std::int64_t Generate(engine::Engine& eng, const std::vector<std::unique_ptr<DemoSession>>& ss,
                      int steps) {
  std::int64_t tokens_forwarded = 0;
  std::vector<engine::StepItemResult> results;
  for (int step = 0; step <= steps; ++step) {
    std::vector<engine::StepItem> items;
    std::vector<DemoSession*> who;
    for (const auto& s : ss) {
      if (!s->stopped.empty()) continue;
      std::span<const TokenId> chunk =
          step == 0 ? std::span<const TokenId>(s->tokens) : std::span<const TokenId>(&s->next, 1);
      items.push_back({s->id, chunk, engine::LogitsMode::kLast});
      who.push_back(s.get());
    }
    if (items.empty()) break;
    eng.Step(items, &results);
    tokens_forwarded += eng.last_step().num_tokens;
    for (std::size_t i = 0; i < who.size(); ++i) {
      DemoSession& s = *who[i];
      if (results[i].status != engine::StepStatus::kOk) {
        s.stopped = engine::ToString(results[i].status);
        continue;
      }
      if (step > 0) s.tokens.push_back(s.next);
      s.next = s.sampler.Sample(eng.logits(results[i].first_logits_row));
    }
  }
  return tokens_forwarded;
}

// Each session's KV figures and text (one line, cut at 72 characters).
void PrintSessions(const engine::Engine& eng, const model::Model& m,
                   const std::vector<std::unique_ptr<DemoSession>>& ss) {
  for (std::size_t i = 0; i < ss.size(); ++i) {
    const DemoSession& s = *ss[i];
    const kv::SessionKvStats k = eng.session_kv(s.id)->stats();
    std::string text;
    if (m.tokenizer != nullptr) {
      text = m.tokenizer->Decode(s.tokens);
      for (char& c : text) {
        if (c == '\n' || c == '\r' || c == '\t') c = ' ';
      }
      if (text.size() > 72) text = text.substr(0, 72) + "...";
    }
    std::printf("session %zu [%-22s] tokens %4lld resident %3lld blocks peak %3lld freed %3lld%s\n",
                i, s.policy.ToString().c_str(), static_cast<long long>(k.tokens_seen),
                static_cast<long long>(k.resident_blocks),
                static_cast<long long>(k.peak_resident_blocks),
                static_cast<long long>(k.blocks_freed_by_window),
                s.stopped.empty() ? "" : ("  STOPPED: " + s.stopped).c_str());
    std::printf("    %s\n", text.c_str());
  }
}

int RunDemo(const DemoFlags& f) {
  model::Model m = f.model.Load();
  const kv::KvPolicy window_policy = kv::KvPolicy::Window(f.window, f.sinks);
  // Pool: each windowed session at its bound, each full session for its whole run.
  engine::EngineOptions eo =
      f.engine.Options(m.config, kv::KvPolicy::Full(), f.sessions, f.steps + 16, 16);
  engine::Engine eng(m, eo);
  const std::vector<std::unique_ptr<DemoSession>> ss = OpenSessions(eng, m, f, window_policy);

  std::printf("metronome demo: %d sessions on %s (%d layers, dim %d, vocab %d), %d steps\n",
              f.sessions, m.config.name.c_str(), m.config.num_layers, m.config.dim,
              m.config.vocab_size, f.steps);
  std::printf(
      "KV pool: %lld blocks of %lld tokens (%s); even sessions full KV, odd sessions %s\n\n",
      static_cast<long long>(eng.pool_stats().num_blocks),
      static_cast<long long>(eng.pool_stats().block_tokens),
      HumanBytes(static_cast<double>(eng.pool_stats().num_blocks) *
                 static_cast<double>(eng.pool_stats().bytes_per_block))
          .c_str(),
      window_policy.ToString().c_str());

  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t tokens_forwarded = Generate(eng, ss, f.steps);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  PrintSessions(eng, m, ss);
  if (m.config.name.rfind("synthetic:", 0) == 0) {
    std::printf(
        "\n(The text is noise: synthetic models have seeded random weights. For a real model try\n"
        " --model ../shared/models/stories260K.bin --tokenizer ../shared/models/tok512.bin)\n");
  }
  const kv::PoolStats ps = eng.pool_stats();
  std::printf(
      "\n%lld tokens in %.2f s: %.0f tokens/s; KV pool used %lld / %lld blocks (%.0f%%), "
      "%lld blocks returned by windows\n",
      static_cast<long long>(tokens_forwarded), secs, static_cast<double>(tokens_forwarded) / secs,
      static_cast<long long>(ps.used_blocks), static_cast<long long>(ps.num_blocks),
      100.0 * static_cast<double>(ps.used_blocks) / static_cast<double>(ps.num_blocks),
      static_cast<long long>(ps.blocks_freed_by_window));
  return 0;
}

}  // namespace

const AddCommandFlags kAddDemoFlags = &AddFlagsAndRun<DemoFlags, RunDemo>;

}  // namespace metronome::cli
