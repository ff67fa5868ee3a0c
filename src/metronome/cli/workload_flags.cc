#include "metronome/cli/workload_flags.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "metronome/base/errors.h"
#include "metronome/serving/engine_backend.h"
#include "metronome/telemetry/event_log.h"
#include "metronome/telemetry/metrics.h"

namespace metronome::cli {
namespace {

std::string Seconds(double s) {
  if (!std::isfinite(s)) return "never";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

admission::CooldownMode ParseCooldown(const std::string& spec, double* fixed_s) {
  if (spec == "drain") return admission::CooldownMode::kDrain;
  if (spec.rfind("fixed:", 0) == 0) {
    const std::string v = spec.substr(6);
    std::size_t used = 0;
    double s = -1.0;
    try {
      s = std::stod(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == v.size() && !v.empty() && s >= 0.0 && std::isfinite(s)) {
      *fixed_s = s;
      return admission::CooldownMode::kFixed;
    }
  }
  throw ConfigError("--aimd-cooldown = '" + spec + "' must be 'drain' or 'fixed:SECONDS'");
}

void PrintProgressHeader() {
  std::printf("%8s %7s %6s %8s %9s %10s %9s %7s %8s %6s %7s\n", "t_s", "active", "limit", "kv_used",
              "t_sat_s", "frames", "ok", "late", "starved", "short", "alarms");
}

void PrintProgress(const realtime::RunSample& s) {
  const std::string limit =
      s.limit == admission::kNoLimit ? std::string("-") : std::to_string(s.limit);
  const std::string t_sat = std::isfinite(s.t_sat_s) ? FormatValue(std::round(s.t_sat_s)) : "inf";
  std::printf("%8.1f %7lld %6s %7.1f%% %9s %10lld %9lld %7lld %8lld %6lld %7lld\n", s.t_s,
              static_cast<long long>(s.active), limit.c_str(), 100.0 * s.kv_used_fraction,
              t_sat.c_str(), static_cast<long long>(s.frames), static_cast<long long>(s.ok),
              static_cast<long long>(s.late), static_cast<long long>(s.starved),
              static_cast<long long>(s.short_frames), static_cast<long long>(s.mute_alarms));
  std::fflush(stdout);
}

void PrintSummary(const realtime::RunSummary& s) {
  std::printf("frames: %s\n", FrameBreakdown(s).c_str());
  std::printf("deadline misses: %lld (%.2f%%); mute alarms: %lld; first starved frame: %s\n",
              static_cast<long long>(s.deadline_misses()), PercentOfFrames(s, s.deadline_misses()),
              static_cast<long long>(s.mute_alarms),
              std::isfinite(s.first_starved_at_s) ? Seconds(s.first_starved_at_s).c_str() : "none");
  std::printf("saturation forecast: pool full at %s (forecast made at %s); KV peak %.1f%%\n",
              Seconds(s.t_sat_predicted_s).c_str(), Seconds(s.t_sat_forecast_at_s).c_str(),
              100.0 * s.kv_peak_fraction);
  const std::string limit_final =
      s.limit_final == admission::kNoLimit ? std::string("none") : std::to_string(s.limit_final);
  std::printf(
      "admission %s: %lld admitted, %lld rejected, %lld gave up (%s); limit final %s, mean over "
      "the second half %s; active mean over the second half %.1f (peak %lld)\n",
      s.admission.c_str(), static_cast<long long>(s.admitted), static_cast<long long>(s.rejected),
      static_cast<long long>(s.abandoned), ArrivalsLine(s).c_str(), limit_final.c_str(),
      std::isfinite(s.limit_mean_second_half) ? FormatValue(s.limit_mean_second_half).c_str() : "-",
      s.active_mean_second_half, static_cast<long long>(s.active_peak));
  if (s.frames > 0) {
    std::printf("frame latency: p50 %.2f ms, p99 %.2f ms (deadline %g ms)\n",
                s.p50_frame_latency_ms, s.p99_frame_latency_ms, s.deadline_ms);
  }
  if (s.ended_by_error > 0) {
    std::printf("sessions ended by an error (context limit): %lld\n",
                static_cast<long long>(s.ended_by_error));
  }
  for (const realtime::ClassSummary& c : s.classes) {
    std::printf(
        "class %s: %lld arrivals, %lld admitted (%.1f units of work; %.1f active over the second "
        "half), %lld rejected; frames %s; p99 %.2f ms (deadline %g ms)\n",
        c.name.c_str(), static_cast<long long>(c.arrivals), static_cast<long long>(c.admitted),
        c.admitted_work, c.active_work_mean_second_half, static_cast<long long>(c.rejected),
        FrameBreakdown(c).c_str(), c.p99_frame_latency_ms, c.deadline_ms);
  }
}

}  // namespace

double PercentOfFrames(const realtime::FrameCounts& c, std::int64_t n) {
  return c.frames > 0 ? 100.0 * static_cast<double>(n) / static_cast<double>(c.frames) : 0.0;
}

std::string FrameBreakdown(const realtime::FrameCounts& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%lld = %lld ok + %lld late + %lld starved + %lld short (%.2f%% "
                "starved or short)",
                static_cast<long long>(c.frames), static_cast<long long>(c.ok),
                static_cast<long long>(c.late), static_cast<long long>(c.starved),
                static_cast<long long>(c.short_frames),
                PercentOfFrames(c, c.starved + c.short_frames));
  return buf;
}

std::string ArrivalsLine(const realtime::FrameSummary& s) {
  if (s.arrivals <= 0) return "no arrivals";
  char buf[96];
  std::snprintf(buf, sizeof buf, "%lld arrivals, %.2f rejections per arrival",
                static_cast<long long>(s.arrivals), s.rejections_per_arrival());
  return buf;
}

void WorkloadFlags::Register(CLI::App* app) {
  RegisterSessionShape(app);
  RegisterPopulation(app);
  app->add_option("--mix", mix,
                  "A mix of session classes, NAME:KEY=VALUE,...;NAME:... with keys period_ms, "
                  "deadline_ms, in, out, prompt (tokens) and share (relative weight of its "
                  "arrivals), e.g. 'speech:period_ms=80,in=1,out=1,share=6;assistant:period_ms="
                  "2000,in=64,out=32,share=2'; unset keys take the session-shape flags, which "
                  "stay the reference session (one unit of work). The summary reports each class");
  RegisterAdmission(app);
  RegisterOutputs(app, /*with_metrics_out=*/true);
}

void WorkloadFlags::RegisterSessionShape(CLI::App* app) {
  app->add_option("--period-ms", period_ms,
                  "Frame period P in ms (default: the preset's for sim, 80 for drive)");
  app->add_option("--deadline-ms", deadline_ms,
                  "Frame deadline D in ms, counted from the frame's arrival (default: P)");
  app->add_option("--tokens-per-frame", tokens_per_frame,
                  "a: input tokens appended per frame, one prefill chunk (default: the preset's "
                  "for sim, 1 for drive)");
  app->add_option("--output-tokens-per-frame", output_tokens_per_frame,
                  "o: output tokens decoded per frame, each appended to the KV (default: the "
                  "preset's for sim, 1 for drive)");
  app->add_option("--prompt-tokens", prompt_tokens,
                  "Initial prompt length in tokens, fed with each session's first frame")
      ->check(CLI::Range(0, 1 << 20));
  app->add_option("--kv", kv.kv,
                  "Per-session KV policy: full | window (default: the preset's for sim, window "
                  "for drive, the server's for loadgen)")
      ->check(CLI::IsMember({"full", "window"}));
  app->add_option("--window", kv.window,
                  "W: most recent tokens kept, window mode (default: the preset's for sim; for "
                  "drive the model's trained context capped by --max-window; the server's for "
                  "loadgen)");
  app->add_option("--sinks", kv.sinks,
                  "S: first tokens pinned as attention sinks, window mode (default: 4)");
  app->add_option("--positions", kv.positions,
                  "RoPE positions: absolute | rolling (default: absolute for sim, rolling for "
                  "drive, the server's for loadgen)")
      ->check(CLI::IsMember({"absolute", "rolling"}));
}

void WorkloadFlags::RegisterPopulation(CLI::App* app) {
  app->add_option("--sessions", sessions,
                  "A fixed population of N sessions asking at t=0 (retrying until admitted)");
  app->add_option("--arrival", arrival,
                  "Session arrivals: poisson:RATE (per s) | ramp:R0,R1,SECONDS");
  app->add_option("--session-duration", session_duration,
                  "Session lifetime in s: fixed:S | exp:MEAN | lognormal:MU,SIGMA (default: until "
                  "the run ends)");
  app->add_option("--duration", duration_s, "Run length in seconds");
  app->add_option("--seed", seed, "Seed of every random draw (arrivals, durations, phases)");
  app->add_option("--patience-s", patience_s,
                  "How long an arriving client retries after a rejection before giving up");
  app->add_flag("--aligned-phases", aligned_phases,
                "Start every population session's frames at t=0 (default: random phases)");
}

void WorkloadFlags::RegisterAdmission(CLI::App* app) { admission.Register(app); }

void AdmissionFlags::Register(CLI::App* app) {
  app->add_option("--admission", admission,
                  "Admission controller: static:N | memory | aimd | gradient2")
      ->capture_default_str();
  app->add_option("--max-sessions", max_sessions,
                  "Hard cap on concurrent sessions, whatever the controller says (0: none)");
  RegisterAimd(app);
  RegisterGradient2(app);
  app->add_option("--memory-session-s", memory.full_mode_session_s,
                  "memory/KV guard: assumed session length for the full-KV projection, s");
  app->add_option("--memory-headroom", memory.headroom_fraction,
                  "memory/KV guard: fraction of the pool never promised, in [0, 1)");
  app->add_option("--max-session-share", work.max_session_share,
                  "One session may take at most this share of the engine per second, as the "
                  "calibrated step cost prices what it declares; a heavier one is refused with "
                  "reason work, in (0, 1]")
      ->capture_default_str();
  app->add_option("--min-deadline-ms", work.min_deadline_ms,
                  "Refuse sessions whose deadline or period is under this many ms (reason "
                  "deadline or period), besides the calibrated floor (a frame alone on the engine "
                  "may take at most half the deadline); 0: the calibrated floor alone")
      ->capture_default_str();
  app->add_option("--mute-after", mute_after,
                  "k: consecutive starved frames that raise a session's mute alarm");
  app->add_option("--max-step-tokens", max_step_tokens,
                  "Tokens one engine step may carry; over it frames go earliest-deadline-first and "
                  "an input that does not fit is split over steps (0: no limit; default: " +
                      std::to_string(serving::kEngineStepTokens) +
                      " on the engine (serve, drive), none in sim)");
  app->add_option("--forecast-horizon-s", forecast_horizon_s,
                  "Warn when the pool is forecast to fill within this many seconds");
}

void AdmissionFlags::RegisterAimd(CLI::App* app) {
  app->add_option("--aimd-window-s", aimd_window_s,
                  "AIMD/gradient2 longest control window, s (default: 2 s or 25 frame periods, "
                  "whichever is longer)");
  app->add_option("--aimd-window-frames", window.window_frames,
                  "AIMD/gradient2: a window closes early once it holds this many frames (0: "
                  "windows last --aimd-window-s)");
  app->add_option("--aimd-min-window-s", aimd_min_window_s,
                  "AIMD/gradient2 shortest control window, s (default: 0.5 s or 2 frame periods, "
                  "whichever is longer)");
  app->add_option("--aimd-percentile", aimd.percentile,
                  "AIMD signal: this percentile of frame latency / deadline");
  app->add_option("--aimd-low", aimd.low_target,
                  "AIMD grows while the signal is below this fraction of D");
  app->add_option("--aimd-high", aimd.high_target,
                  "AIMD cuts when the signal exceeds this fraction of D");
  app->add_option("--aimd-miss-ratio", aimd.miss_ratio_threshold,
                  "AIMD cuts when a window's deadline-miss ratio exceeds this");
  app->add_option("--aimd-step", aimd.increase_step,
                  "AIMD least increase, sessions/window (once slow start has ended)");
  app->add_option("--aimd-slow-start", aimd.slow_start_factor,
                  "AIMD slow start: grow up to this factor per window while far below the low "
                  "target (1: no slow start)");
  app->add_option("--aimd-headroom-gain", aimd.headroom_gain,
                  "AIMD: move this fraction of the way to the projected low-target crossing per "
                  "window (0: a fixed --aimd-step)");
  app->add_option("--aimd-growth-horizon-s", aimd.growth_horizon_s,
                  "AIMD grows only while the percentile of every frame of this many seconds is "
                  "under the low target (0: the last window alone)");
  app->add_option("--aimd-max-utilization", aimd.max_utilization,
                  "AIMD grows only while the engine's work utilization (per-token step time / "
                  "wall time, at the slowest per-token cost of the last minutes, projected to the "
                  "new limit) stays under this; 1: no cap");
  app->add_option("--aimd-self-late-fraction", aimd.self_late_work_fraction,
                  "AIMD leaves out of each window's signal the session with the largest share of "
                  "late frames, and the next worst while the work left out stays within this "
                  "fraction: a session late by itself cannot cut everyone's budget (0: every "
                  "frame counts), in [0, 0.5]")
      ->capture_default_str();
  app->add_option("--aimd-predicted-limit", aimd.predicted_limit,
                  "AIMD: N* predicted by a calibrated cost model; seeds the limit with no slow "
                  "start, growth past it by one step per growth horizon (0: none)");
  app->add_option("--aimd-beta", aimd.beta, "AIMD cut: limit = floor(beta x active)");
  app->add_option("--aimd-cooldown", aimd_cooldown,
                  "After a cut: drain (hold until a full window ran at or under the limit) | "
                  "fixed:SECONDS");
  aimd_initial_option = app->add_option(
      "--aimd-initial", aimd.initial_limit,
      "AIMD starting limit (warm start), in units of work: one unit is one session of the "
      "server's reference shape; an empty engine admits one session over it and the limit "
      "follows its price");
  app->add_option("--aimd-min", window.min_limit, "AIMD/gradient2 lowest limit, units of work");
  app->add_option("--aimd-max", window.max_limit, "AIMD/gradient2 highest limit, units of work");
  app->add_option("--aimd-min-samples", window.min_samples,
                  "AIMD/gradient2 hold on windows with fewer frames than this");
  app->add_flag("--kv-guard,!--no-kv-guard", window.kv_guard,
                std::string("AIMD/gradient2 also require active < sessions the KV pool can hold "
                            "(look-ahead guard; default ") +
                    (window.kv_guard ? "on" : "off") + ")");
}

void AdmissionFlags::RegisterGradient2(CLI::App* app) {
  app->add_option("--gradient2-initial", gradient2.initial_limit, "gradient2 starting limit");
  app->add_option("--gradient2-tolerance", gradient2.tolerance,
                  "gradient2: short-run latency may exceed the long-run one by this factor");
  app->add_option("--gradient2-smoothing", gradient2.smoothing,
                  "gradient2: weight of each window's new estimate, in (0, 1]");
  app->add_option("--gradient2-queue-size", gradient2.queue_size,
                  "gradient2: sessions added per window at gradient 1");
  app->add_option("--gradient2-long-window", gradient2.long_window,
                  "gradient2: windows in the long-run latency average");
}

void WorkloadFlags::RegisterOutputs(CLI::App* app, bool with_metrics_out) {
  app->add_option("--events-out", events_out,
                  "Write a JSON-lines event log (frames, admissions, limit changes, alarms)");
  if (with_metrics_out) {
    app->add_option("--metrics-out", metrics_out,
                    "Write the Prometheus text exposition of the run's metrics at the end");
    app->add_option("--timeseries-out", timeseries_out,
                    "Write a CSV row per sample (active, limit, KV used, forecast, cumulative "
                    "frames by outcome, the interval's p50/p99 latency and tokens per frame, the "
                    "engine's busy fraction and work utilization)");
  }
  app->add_flag("--summary-json", summary_json,
                "Print the run summary as one JSON object on the last line");
  app->add_option("--report-every", report_every_s,
                  "Print a progress line every this many seconds of the clock (0: off)");
  app->add_flag("--quiet", quiet, "No alarm, limit-change or forecast lines on stderr");
}

AdmissionFlags ServingAdmissionFlags() {
  AdmissionFlags f;
  f.admission = "aimd";
  f.max_step_tokens = serving::kEngineStepTokens;
  return f;
}

double DefaultAimdWindowS(double period_ms) { return std::max(2.0, 25.0 * period_ms / 1000.0); }

realtime::SupervisorOptions AdmissionFlags::Supervisor(double period_ms) const {
  realtime::SupervisorOptions o;
  o.admission = admission;
  o.max_sessions = max_sessions;
  // aimd and gradient2 share the window and the guard: one comparison, one notion of a window.
  admission::WindowOptions w = window;
  w.window_s = aimd_window_s.value_or(DefaultAimdWindowS(period_ms));
  w.min_window_s = aimd_min_window_s.value_or(std::max(0.5, 2.0 * period_ms / 1000.0));
  o.aimd = aimd;
  o.aimd.window = w;
  o.aimd.cooldown_mode = ParseCooldown(aimd_cooldown, &o.aimd.cooldown_s);
  o.gradient2 = gradient2;
  o.gradient2.window = w;
  o.memory = memory;
  o.work = work;
  if (mute_after < 1) {
    throw ConfigError("--mute-after = " + std::to_string(mute_after) + " must be >= 1");
  }
  o.loop.mute_after_starved = mute_after;
  o.loop.max_step_tokens = max_step_tokens;
  o.forecast.horizon_s = forecast_horizon_s;
  return o;
}

std::string WithFlagNames(const std::string& message) {
  // Field (as the library's ConfigErrors spell it) -> flag.
  static constexpr std::pair<std::string_view, std::string_view> kFlagOf[] = {
      {"period_ms", "--period-ms"},
      {"deadline_ms", "--deadline-ms"},
      {"tokens_per_frame", "--tokens-per-frame"},
      {"output_tokens_per_frame", "--output-tokens-per-frame"},
      {"window", "--window"},
      {"sinks", "--sinks"},
      {"prompt_tokens", "--prompt-tokens"},
      {"sessions", "--sessions"},
      {"arrival", "--arrival"},
      {"mix", "--mix"},
      {"session_duration", "--session-duration"},
      {"duration_s", "--duration"},
      {"seed", "--seed"},
      {"patience_s", "--patience-s"},
      {"max_sessions", "--max-sessions"},
      {"mute_after_starved", "--mute-after"},
      {"max_step_tokens", "--max-step-tokens"},
      {"work.max_session_share", "--max-session-share"},
      {"aimd.self_late_work_fraction", "--aimd-self-late-fraction"},
      {"work.min_deadline_ms", "--min-deadline-ms"},
      {"resume_window_s", "--resume-window-s"},
      {"advertise_url", "--advertise-url"},
      {"url", "--url"},
      {"auth_token", "--auth-token"},
      {"payload", "--payload"},
      {"vocab", "--vocab"},
      {"preset", "--preset"},
      {"session_idle.periods", "--idle-periods"},
      {"session_idle.min_ms", "--idle-min-ms"},
      {"session_idle.max_ms", "--idle-max-ms"},
  };
  const auto is_name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == '-';
  };
  std::string out;
  std::size_t i = 0;
  while (i < message.size()) {
    bool mapped = false;
    if (i == 0 || !is_name_char(message[i - 1])) {
      for (const auto& [field, flag] : kFlagOf) {
        if (message.compare(i, field.size(), field) == 0 &&
            message.compare(i + field.size(), 3, " = ") == 0) {
          out += flag;
          i += field.size();
          mapped = true;
          break;
        }
      }
    }
    if (!mapped) out += message[i++];
  }
  return out;
}

void SessionKvFlags::ApplyTo(realtime::SessionShape* shape) const {
  // CLI11 admits only the parsers' spellings.
  if (kv) shape->kv_mode = kv::ParseKvMode(*kv);
  if (window) shape->window = *window;
  if (sinks) shape->sinks = *sinks;
  if (positions) shape->positions = kv::ParsePositionMode(*positions);
}

realtime::SessionShape WorkloadFlags::Shape() const {
  realtime::SessionShape shape;
  shape.period_ms = period_ms;
  shape.deadline_ms = deadline_ms;
  shape.tokens_per_frame = tokens_per_frame;
  shape.output_tokens_per_frame = output_tokens_per_frame;
  kv.ApplyTo(&shape);
  if (prompt_tokens > 0) shape.prompt = realtime::SyntheticPrompt{.tokens = prompt_tokens};
  return shape;
}

realtime::PopulationOptions WorkloadFlags::Population() const {
  return {.sessions = sessions,
          .aligned_phases = aligned_phases,
          .arrival = arrival,
          .session_duration = session_duration,
          .duration_s = duration_s,
          .seed = seed,
          .patience_s = patience_s};
}

realtime::WorkloadOptions WorkloadFlags::Options(SessionDefaults defaults, int vocab) const {
  return ReportingFlags([&] {
    realtime::WorkloadOptions o;
    defaults.vocab_size = vocab;
    o.session = realtime::ResolveSessionOrThrow(Shape(), defaults);
    o.population = Population();
    if (!mix.empty()) {
      // Each class's keys over the flags' shape (and --prompt-tokens when it gives no prompt).
      const SessionDefaults base = realtime::WithOverrides(defaults, Shape());
      for (realtime::SessionClass& c : realtime::ParseSessionMix(mix)) {
        if (std::holds_alternative<std::monostate>(c.shape.prompt)) c.shape.prompt = Shape().prompt;
        o.classes.push_back({.name = c.name,
                             .session = realtime::ResolveSessionOrThrow(c.shape, base),
                             .share = c.share});
      }
    }
    o.supervisor = admission.Supervisor(o.session.period_ms);
    // Short runs (drive on a small pool hits its wall in seconds) sample and settle faster.
    o.supervisor.sample_interval_s = std::min(0.5, duration_s / 200.0);
    o.supervisor.log_to_stderr = !quiet;
    // Block-granular growth is lumpy over the first frames: fit at least 10 periods of it.
    o.forecast_settle_s =
        std::min(std::max(5.0, 10.0 * o.session.period_ms / 1000.0), duration_s / 20.0);
    o.Validate();
    return o;
  });
}

int RunWorkload(realtime::Backend* backend, Clock* clock, const WorkloadFlags& flags,
                const realtime::WorkloadOptions& options, const std::string& header) {
  std::unique_ptr<telemetry::EventLog> events;
  if (!flags.events_out.empty()) events = std::make_unique<telemetry::EventLog>(flags.events_out);
  telemetry::MetricsRegistry registry;
  realtime::WorkloadRunner runner(backend, clock, options, &registry, events.get());
  std::printf("%s", header.c_str());
  double shares = 0.0;
  for (const realtime::WorkloadClass& c : options.classes) shares += c.share;
  for (const realtime::WorkloadClass& c : options.classes) {
    std::printf(
        "  class %s: %.0f%% of arrivals, %g ms frames (deadline %g ms), a=%d o=%d, prompt %zu "
        "tokens\n",
        c.name.c_str(), 100.0 * c.share / shares, c.session.period_ms, c.session.deadline_ms,
        c.session.input_tokens_per_frame, c.session.output_tokens_per_frame,
        c.session.prompt.size());
  }
  std::fflush(stdout);

  std::ofstream timeseries;
  if (!flags.timeseries_out.empty()) {
    timeseries.open(flags.timeseries_out);
    if (!timeseries) {
      throw ConfigError("--timeseries-out = '" + flags.timeseries_out + "' cannot be opened");
    }
    timeseries << "t_s,active,limit,kv_used_fraction,t_sat_s,frames,ok,late,starved,short,"
                  "mute_alarms,admitted,rejected,interval_frames,interval_p50_ms,"
                  "interval_p99_ms,interval_tokens_per_frame,busy_fraction,work_utilization\n";
  }
  const auto csv_number = [](double v) { return std::isfinite(v) ? FormatValue(v) : ""; };
  std::function<void(const realtime::RunSample&)> progress;
  if (flags.report_every_s > 0.0) {
    PrintProgressHeader();
    auto next_report_s = std::make_shared<double>(flags.report_every_s);
    progress = [next_report_s, every = flags.report_every_s](const realtime::RunSample& s) {
      if (s.t_s + 1e-9 < *next_report_s) return;
      PrintProgress(s);
      while (*next_report_s <= s.t_s + 1e-9) *next_report_s += every;
    };
  }
  runner.on_sample = [&](const realtime::RunSample& s) {
    if (progress) progress(s);
    if (!timeseries.is_open()) return;
    timeseries << FormatValue(s.t_s) << ',' << s.active << ','
               << (s.limit == admission::kNoLimit ? std::string() : std::to_string(s.limit)) << ','
               << FormatValue(s.kv_used_fraction) << ',' << csv_number(s.t_sat_s) << ',' << s.frames
               << ',' << s.ok << ',' << s.late << ',' << s.starved << ',' << s.short_frames << ','
               << s.mute_alarms << ',' << s.admitted << ',' << s.rejected << ','
               << s.interval_frames << ',' << csv_number(s.interval_p50_latency_ms) << ','
               << csv_number(s.interval_p99_latency_ms) << ','
               << csv_number(s.interval_tokens_per_frame) << ',' << FormatValue(s.busy_fraction)
               << ',' << csv_number(s.work_utilization) << '\n';
  };
  const realtime::RunSummary summary = runner.Run();
  PrintSummary(summary);
  if (!flags.metrics_out.empty()) registry.WriteExpositionFile(flags.metrics_out);
  if (timeseries.is_open() && !timeseries.flush()) {
    std::fprintf(stderr, "error: writing --timeseries-out '%s' failed (disk full?)\n",
                 flags.timeseries_out.c_str());
    return 1;
  }
  if (events && !events->ok()) {
    std::fprintf(stderr, "error: writing --events-out '%s' failed (disk full?)\n",
                 flags.events_out.c_str());
    return 1;
  }
  if (flags.summary_json) {
    nlohmann::json j = summary.ToJson();
    // The AIMD control window the run used (by default it depends on the period), so scripts read
    // it instead of restating DefaultAimdWindowS; null under other controllers.
    j["aimd_window_s"] = options.supervisor.admission == "aimd"
                             ? nlohmann::json(options.supervisor.aimd.window.window_s)
                             : nlohmann::json(nullptr);
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

}  // namespace metronome::cli
