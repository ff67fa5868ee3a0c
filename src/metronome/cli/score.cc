// metronome score: teacher-forced scoring of a sequence (perplexity, optional logits dump).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/engine/feed.h"

namespace metronome::cli {
namespace {

struct ScoreFlags {
  ModelFlags model;
  KvFlags kv;
  EngineFlags engine;
  std::string ids;
  std::string ids_file;
  std::string text_file;
  std::string logits_out;
  int chunk = 256;
  void Register(CLI::App* sub);
};

void ScoreFlags::Register(CLI::App* sub) {
  model.Register(sub, true);
  kv.Register(sub);
  engine.Register(sub);
  auto* a = sub->add_option("--ids", ids, "Token ids, e.g. \"1 2 3\"");
  auto* b = sub->add_option("--ids-file", ids_file, "File of whitespace-separated ids");
  auto* c = sub->add_option("--text-file", text_file, "Text file (tokenized, BOS prepended)");
  a->excludes(b)->excludes(c);
  b->excludes(c);
  sub->add_option("--logits-out", logits_out, "Write one line per position: pos v0 v1 ... v(V-1)");
  sub->add_option("--chunk", chunk, "Prefill chunk size in tokens")->check(CLI::Range(1, 1 << 20));
}

// log-sum-exp in double: the nll of one position must not depend on the logits' offset.
double NegLogLikelihood(std::span<const float> logits, TokenId target) {
  double m = logits[0];
  for (const float v : logits) m = std::max(m, static_cast<double>(v));
  double sum = 0.0;
  for (const float v : logits) sum += std::exp(static_cast<double>(v) - m);
  return std::log(sum) + m - static_cast<double>(logits[static_cast<std::size_t>(target)]);
}

int RunScore(const ScoreFlags& f) {
  const model::Model m = f.model.Load();
  std::vector<TokenId> ids;
  if (!f.ids.empty()) {
    ids = ParseIds(f.ids, m.config.vocab_size, "--ids");
  } else if (!f.ids_file.empty()) {
    ids = ParseIds(ReadFile(f.ids_file, "--ids-file"), m.config.vocab_size, "--ids-file");
  } else if (!f.text_file.empty()) {
    if (m.tokenizer == nullptr) throw ConfigError("--text-file needs a tokenizer (--tokenizer)");
    ids = m.tokenizer->Encode(ReadFile(f.text_file, "--text-file"), m.tokenizer->adds_bos());
  } else {
    throw ConfigError("give one of --ids, --ids-file or --text-file");
  }
  if (ids.size() < 2) throw ConfigError("the sequence needs at least 2 tokens to score");

  const kv::KvPolicy policy = f.kv.Policy();
  engine::Engine eng(
      m, f.engine.Options(m.config, policy, 1, static_cast<std::int64_t>(ids.size()), f.chunk));
  engine::SessionOptions so;
  so.policy = policy;
  so.max_context = f.kv.max_context;
  const engine::SessionId sid = eng.OpenSession(so);

  std::ofstream logits_file;
  if (!f.logits_out.empty()) {
    logits_file.open(f.logits_out);
    if (!logits_file) throw ConfigError("--logits-out: cannot write '" + f.logits_out + "'");
  }
  double total_nll = 0.0;
  std::size_t scored = 0;
  const engine::StepStatus st = engine::Feed(
      eng, sid, ids, f.chunk, true, [&](std::size_t pos, std::span<const float> logits) {
        if (logits_file.is_open()) {
          logits_file << pos;
          char buf[32];
          for (const float v : logits) {
            std::snprintf(buf, sizeof buf, " %.6f", static_cast<double>(v));
            logits_file << buf;
          }
          logits_file << '\n';
        }
        if (pos + 1 < ids.size()) {
          total_nll += NegLogLikelihood(logits, ids[pos + 1]);
          ++scored;
        }
      });
  if (st != engine::StepStatus::kOk) {
    std::fprintf(stderr, "error: scoring stopped after %zu positions: %s\n", scored,
                 DescribeStepFailure(st).c_str());
    return 3;
  }
  const double mean = total_nll / static_cast<double>(scored);
  std::printf("tokens %zu scored %zu mean_nll %.6f ppl %.6f kv %s\n", ids.size(), scored, mean,
              std::exp(mean), policy.ToString().c_str());
  return 0;
}

}  // namespace

const AddCommandFlags kAddScoreFlags = &AddFlagsAndRun<ScoreFlags, RunScore>;

}  // namespace metronome::cli
