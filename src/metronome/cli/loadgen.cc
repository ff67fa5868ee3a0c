// metronome loadgen: paced real-time sessions against `metronome serve` over WebSocket, with the
// workload flags of sim and drive, every frame judged on the client's clock.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/workload_flags.h"
#include "metronome/loadgen/load_generator.h"

namespace metronome::cli {
namespace {

struct LoadgenFlags {
  std::string url;
  std::string auth_token;
  std::string payload = "random";
  std::string encoding = "binary";
  int vocab = 0;
  bool no_reconnect = false;
  bool no_resume = false;
  WorkloadFlags workload;
  LoadgenFlags() { workload.report_every_s = 2.0; }  // progress lines on by default
  void Register(CLI::App* sub);
};

void LoadgenFlags::Register(CLI::App* sub) {
  sub->add_option("--url", url, "Server, ws://HOST:PORT (path default /v1/realtime)")->required();
  sub->add_option("--auth-token", auth_token, "Bearer token the server asks for");
  sub->add_option("--payload", payload,
                  "Frame inputs: random (seeded ids) | ids:FILE (token ids, whitespace or comma "
                  "separated) | text:FILE (a = words per frame, tokenised by the server)");
  sub->add_option("--encoding", encoding, "Id frames as binary | json messages")
      ->check(CLI::IsMember({"binary", "json"}));
  sub->add_option("--vocab", vocab,
                  "Random ids are drawn from [0, VOCAB) (default: the server's vocabulary)")
      ->check(CLI::Range(0, 1 << 30));
  sub->add_flag("--no-reconnect", no_reconnect,
                "A client whose session's connection drops, or whose upgrade is refused with an "
                "HTTP status (a balancer with no room), leaves instead of asking again on a new "
                "connection after the retry backoff");
  sub->add_flag("--no-resume", no_resume,
                "A session whose server sends session.moving (a drain) or whose connection drops "
                "ends (counted as dropped) instead of being taken back with session.resume on a "
                "new connection");
  workload.RegisterSessionShape(sub);
  workload.RegisterPopulation(sub);
  workload.RegisterOutputs(sub, /*with_metrics_out=*/false);
  sub->get_option("--events-out")
      ->description(
          "Write a trace: JSON lines (frames, admissions, rejections, alarms, errors, "
          "session ends), or CSV of the frames when the name ends in .csv");
  sub->get_option("--report-every")
      ->description("Print a progress line every this many seconds (default 2; 0: off)");
}

loadgen::LoadGenOptions OptionsOf(const LoadgenFlags& f) {
  return ReportingFlags([&] {
    const WorkloadFlags& w = f.workload;
    loadgen::LoadGenOptions o;
    o.url = f.url;
    o.auth_token = f.auth_token;
    o.session = w.Shape();
    o.population = w.Population();
    o.payload = loadgen::PayloadSource::Parse(f.payload);
    o.binary_frames = f.encoding == "binary";
    o.vocab = f.vocab;
    o.reconnect = !f.no_reconnect;
    o.resume = !f.no_resume;
    o.sample_interval_s = std::min(0.5, w.duration_s / 20.0);
    if (w.quiet) o.alarms_to_stderr = 0;
    o.Validate();
    return o;
  });
}

void PrintProgressHeader() {
  std::printf("%8s %7s %8s %9s %9s %7s %8s %6s %7s %9s %7s %12s\n", "t_s", "active", "waiting",
              "frames", "ok", "late", "starved", "short", "alarms", "rejected", "errors",
              "p99_ms(1s)");
}

void PrintProgress(const loadgen::LoadGenSample& s) {
  std::printf(
      "%8.1f %7lld %8lld %9lld %9lld %7lld %8lld %6lld %7lld %9lld %7lld %12s\n", s.t_s,
      static_cast<long long>(s.active), static_cast<long long>(s.waiting),
      static_cast<long long>(s.frames), static_cast<long long>(s.ok),
      static_cast<long long>(s.late), static_cast<long long>(s.starved),
      static_cast<long long>(s.short_frames), static_cast<long long>(s.mute_alarms),
      static_cast<long long>(s.rejected), static_cast<long long>(s.errors),
      std::isfinite(s.p99_latency_ms_recent) ? FormatValue(s.p99_latency_ms_recent).c_str() : "-");
  std::fflush(stdout);
}

void PrintSummary(const loadgen::LoadGenSummary& s) {
  std::printf("frames sent %lld, answered %s; lost %lld, refused %lld\n",
              static_cast<long long>(s.frames_sent), FrameBreakdown(s).c_str(),
              static_cast<long long>(s.lost_frames), static_cast<long long>(s.refused_frames));
  std::printf(
      "deadline misses (late frames, client clock): %lld (%.2f%%); results after the "
      "deadline, any outcome: %lld; mute alarms: %lld; first starved frame: %s\n",
      static_cast<long long>(s.deadline_misses()), PercentOfFrames(s, s.deadline_misses()),
      static_cast<long long>(s.after_deadline_frames), static_cast<long long>(s.mute_alarms),
      std::isfinite(s.first_starved_at_s) ? (FormatValue(s.first_starved_at_s) + " s").c_str()
                                          : "none");
  std::printf(
      "sessions: %lld admitted, %lld rejections, %lld gave up (%s), %lld ended by the server; "
      "peak active %lld; errors %lld, failed connections %lld\n",
      static_cast<long long>(s.admitted), static_cast<long long>(s.rejected),
      static_cast<long long>(s.abandoned), ArrivalsLine(s).c_str(),
      static_cast<long long>(s.ended_by_error), static_cast<long long>(s.active_peak),
      static_cast<long long>(s.errors), static_cast<long long>(s.connect_failures));
  std::string refused;
  for (const auto& [status, n] : s.upgrade_refusals) {
    refused +=
        (refused.empty() ? "" : ", ") + std::to_string(n) + " x HTTP " + std::to_string(status);
  }
  std::printf(
      "connections: %lld sessions dropped (closed while open), %lld reconnects, %lld refused or "
      "reset, upgrades refused: %s\n",
      static_cast<long long>(s.sessions_dropped), static_cast<long long>(s.reconnects),
      static_cast<long long>(s.connections_refused), refused.empty() ? "none" : refused.c_str());
  if (s.moves_followed > 0 || s.sessions_resumed > 0 || !s.resume_failures.empty()) {
    std::string failures;
    for (const auto& [reason, n] : s.resume_failures) {
      failures += (failures.empty() ? "" : ", ") + std::to_string(n) + " x " + reason;
    }
    std::string pause = "no resume";
    if (s.sessions_resumed > 0) {
      pause = "pause p50 " + FormatValue(s.p50_resume_pause_ms) + " ms, p99 " +
              FormatValue(s.p99_resume_pause_ms) + " ms, max " +
              FormatValue(s.max_resume_pause_ms) + " ms";
    }
    std::printf(
        "continuity: %lld moves followed, %lld sessions resumed, resumes refused: %s; %lld "
        "frames missed while away; %s\n",
        static_cast<long long>(s.moves_followed), static_cast<long long>(s.sessions_resumed),
        failures.empty() ? "none" : failures.c_str(), static_cast<long long>(s.missed),
        pause.c_str());
  }
  // Per replica only when some server named itself (session.started's replica).
  if (!s.replicas.empty() && !(s.replicas.size() == 1 && s.replicas.begin()->first.empty())) {
    std::printf("%-28s %8s %6s %8s %8s %9s %9s %6s %8s %6s\n", "replica", "admitted", "ended",
                "by_srv", "dropped", "frames", "ok", "late", "starved", "short");
    for (const auto& [replica, r] : s.replicas) {
      std::printf("%-28s %8lld %6lld %8lld %8lld %9lld %9lld %6lld %8lld %6lld\n",
                  replica.empty() ? "(unnamed)" : replica.c_str(),
                  static_cast<long long>(r.admitted), static_cast<long long>(r.ended),
                  static_cast<long long>(r.ended_by_server), static_cast<long long>(r.dropped),
                  static_cast<long long>(r.frames), static_cast<long long>(r.ok),
                  static_cast<long long>(r.late), static_cast<long long>(r.starved),
                  static_cast<long long>(r.short_frames));
    }
  }
  if (s.frames > 0) {
    std::printf(
        "frame latency: client p50 %.2f ms, p99 %.2f ms; server p50 %.2f ms, p99 %.2f ms "
        "(deadline %g ms); send lag p99 %.2f ms\n",
        s.p50_frame_latency_ms, s.p99_frame_latency_ms, s.p50_server_latency_ms,
        s.p99_server_latency_ms, s.deadline_ms, s.p99_send_lag_ms);
  }
}

int RunLoadgen(const LoadgenFlags& f) {
  const loadgen::LoadGenOptions options = OptionsOf(f);
  const WorkloadFlags& w = f.workload;
  const bool csv =
      w.events_out.size() > 4 && w.events_out.compare(w.events_out.size() - 4, 4, ".csv") == 0;
  std::unique_ptr<telemetry::EventLog> events;
  std::ofstream csv_out;
  if (csv) {
    csv_out.open(w.events_out);
    if (!csv_out) throw ConfigError("--events-out = '" + w.events_out + "' cannot be opened");
    csv_out << "t_s,session,frame,outcome,latency_ms,server_outcome,server_latency_ms,outputs\n";
  } else if (!w.events_out.empty()) {
    events = std::make_unique<telemetry::EventLog>(w.events_out);
  }
  loadgen::LoadGenerator gen(options, events.get());
  if (csv) {
    gen.on_frame = [&csv_out](const loadgen::ClientFrame& c) {
      csv_out << c.t_s << ',' << c.session << ',' << c.frame << ',' << c.outcome << ','
              << c.latency_ms << ',' << c.server_outcome << ',' << c.server_latency_ms << ','
              << c.outputs << '\n';
    };
  }
  const realtime::SessionSpec session = loadgen::ClientSession(options, /*vocab=*/1);
  const realtime::PopulationOptions& population = options.population;
  std::printf("metronome loadgen --url %s: %s, P=%g ms, a=%d, o=%d, KV %s, %g s\n",
              options.url.c_str(),
              population.sessions > 0 ? (std::to_string(population.sessions) + " sessions").c_str()
                                      : ("arrivals " + population.arrival).c_str(),
              session.period_ms, session.input_tokens_per_frame, session.output_tokens_per_frame,
              std::string(kv::ToString(session.policy.mode)).c_str(), population.duration_s);
  std::fflush(stdout);
  if (w.report_every_s > 0.0) {
    PrintProgressHeader();
    auto next_report_s = std::make_shared<double>(w.report_every_s);
    gen.on_sample = [next_report_s, every = w.report_every_s](const loadgen::LoadGenSample& s) {
      if (s.t_s + 1e-9 < *next_report_s) return;
      PrintProgress(s);
      while (*next_report_s <= s.t_s + 1e-9) *next_report_s += every;
    };
  }
  loadgen::LoadGenSummary summary;
  try {
    summary = gen.Run();
  } catch (const std::runtime_error& e) {  // the server is not there, or refused the token
    std::fprintf(stderr, "error: %s\n", WithFlagNames(e.what()).c_str());
    return 1;
  }
  PrintSummary(summary);
  if ((events && !events->ok()) || (csv && !csv_out.flush())) {
    std::fprintf(stderr, "error: writing --events-out '%s' failed (disk full?)\n",
                 w.events_out.c_str());
    return 1;
  }
  if (w.summary_json) std::printf("%s\n", summary.ToJson().dump().c_str());
  return 0;
}

}  // namespace

const AddCommandFlags kAddLoadgenFlags = &AddFlagsAndRun<LoadgenFlags, RunLoadgen>;

}  // namespace metronome::cli
