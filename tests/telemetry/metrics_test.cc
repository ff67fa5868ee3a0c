#include "metronome/telemetry/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/telemetry/engine_metrics.h"
#include "support/prometheus_validator.h"

namespace metronome::telemetry {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

using test_support::Exposition;
using test_support::Labels;
using test_support::ValidateExposition;

// ---- The checker itself catches what it should ----

TEST(ExpositionValidatorTest, AcceptsWellFormedText) {
  Exposition e;
  const std::string text =
      "# a plain comment\n"
      "# HELP x_total Help with \\\\ and \\n.\n"
      "# TYPE x_total counter\n"
      "x_total{a=\"q\\\"\\\\\\n\",b=\"\",} 1.5e3 1700000000000\n"
      "\n"
      "# TYPE h histogram\n"
      "h_bucket{le=\"1\"} 0\n"
      "h_bucket{le=\"+Inf\"} 2\n"
      "h_sum NaN\n"
      "h_count 2\n";
  ASSERT_EQ(ValidateExposition(text, &e), "");
  EXPECT_EQ(e.Value("x_total", {{"a", "q\"\\\n"}, {"b", ""}}), 1500.0);
  EXPECT_EQ(e.help["x_total"], "Help with \\ and \n.");
}

TEST(ExpositionValidatorTest, RejectsMalformedText) {
  const std::vector<std::string> bad = {
      "x 1",                                                       // no final newline
      "x 1\n",                                                     // no TYPE
      "# TYPE x gauge\nx{a=\"b} 1\n",                              // unterminated value
      "# TYPE x gauge\nx{a=\"\\t\"} 1\n",                          // bad escape
      "# TYPE x gauge\nx one\n",                                   // bad number
      "# TYPE x gauge\nx 1\n# TYPE x gauge\n",                     // second TYPE
      "# TYPE x gauge\n# TYPE y gauge\nx 1\ny 1\nx{a=\"1\"} 2\n",  // not contiguous
      "# TYPE x gauge\nx 1\nx 2\n",                                // duplicate series
      "# TYPE 1x gauge\n",                                         // bad name
      "# TYPE x wibble\n",                                         // bad type
      "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 0\nh_count 1\n",
      "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 0\nh_count 1\n",
      "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 0\nh_count 3\n",
  };
  for (const std::string& text : bad) {
    EXPECT_NE(ValidateExposition(text, nullptr), "") << text;
  }
}

// ---- The registry ----

TEST(MetricsRegistryTest, TinyRegistryRendersExactText) {
  MetricsRegistry registry;
  registry.AddCounter("requests_total", "Requests served.").Inc(3);
  registry.AddGaugeFamily("queue_depth", "Depth by queue.", {"queue"})
      .WithLabels({"a\"b"})
      .Set(-1.5);
  Histogram& wait = registry.AddHistogram("wait_ms", "Wait (ms).", {1, 2.5});
  wait.Observe(0.5);
  wait.Observe(2.5);  // on a bound: counted in that bucket (le is inclusive)
  wait.Observe(3);
  EXPECT_EQ(registry.ExpositionText(),
            "# HELP metronome_requests_total Requests served.\n"
            "# TYPE metronome_requests_total counter\n"
            "metronome_requests_total 3\n"
            "# HELP metronome_queue_depth Depth by queue.\n"
            "# TYPE metronome_queue_depth gauge\n"
            "metronome_queue_depth{queue=\"a\\\"b\"} -1.5\n"
            "# HELP metronome_wait_ms Wait (ms).\n"
            "# TYPE metronome_wait_ms histogram\n"
            "metronome_wait_ms_bucket{le=\"1\"} 1\n"
            "metronome_wait_ms_bucket{le=\"2.5\"} 2\n"
            "metronome_wait_ms_bucket{le=\"+Inf\"} 3\n"
            "metronome_wait_ms_sum 6\n"
            "metronome_wait_ms_count 3\n");
}

TEST(MetricsRegistryTest, EveryKindWithEscapedLabelsIsValidExposition) {
  MetricsRegistry registry;
  const std::string nasty = "back\\slash \"quoted\"\nnew line";
  registry.AddCounter("plain_total", "Help with \\ backslash\nand newline.").Inc();
  Counter& real = registry.AddCounter("seconds_total", "Fractional counter (s).");
  real.Add(0.25);
  real.Inc(2);
  real.Add(-5.0);                                      // ignored: counters are monotonic
  real.Add(std::numeric_limits<double>::quiet_NaN());  // ignored
  Family<Counter>& by_kind = registry.AddCounterFamily("events_total", "Events.", {"kind", "id"});
  by_kind.WithLabels({nasty, "1"}).Inc(7);
  by_kind.WithLabels({"", "2"}).Inc();
  registry.AddCounterFamily("never_total", "A family with no children yet.", {"x"});
  registry.AddGauge("forever_seconds", "Infinite.").Set(kInf);
  registry.AddGauge("minus_forever", "Minus infinite.").Set(-kInf);
  registry.AddGauge("unknown", "NaN.").Set(std::numeric_limits<double>::quiet_NaN());
  registry.AddGauge("ns:with_colon", "Colons are allowed in metric names.").Add(2.5);
  Family<Histogram>& lat =
      registry.AddHistogramFamily("lat_ms", "Latency (ms).", {"path"}, DefaultLatencyBucketsMs());
  for (double v : {0.1, 1.0, 3.0, 45.0, 99.0, 7000.0}) lat.WithLabels({nasty}).Observe(v);
  lat.WithLabels({"empty"});
  Histogram& empty_bounds = registry.AddHistogram("only_inf", "No finite bounds.", {});
  empty_bounds.Observe(-1);
  empty_bounds.Observe(std::numeric_limits<double>::quiet_NaN());  // dropped

  Exposition e;
  const std::string text = registry.ExpositionText();
  ASSERT_EQ(ValidateExposition(text, &e), "") << text;
  EXPECT_EQ(e.types["metronome_plain_total"], "counter");
  EXPECT_EQ(e.help["metronome_plain_total"], "Help with \\ backslash\nand newline.");
  EXPECT_EQ(e.Value("metronome_seconds_total"), 2.25);
  EXPECT_EQ(e.Value("metronome_events_total", {{"kind", nasty}, {"id", "1"}}), 7.0);
  EXPECT_EQ(e.Value("metronome_events_total", {{"kind", ""}, {"id", "2"}}), 1.0);
  EXPECT_EQ(e.types["metronome_never_total"], "counter");
  EXPECT_EQ(e.Value("metronome_forever_seconds"), kInf);
  EXPECT_EQ(e.Value("metronome_minus_forever"), -kInf);
  EXPECT_TRUE(std::isnan(e.Value("metronome_unknown")));
  EXPECT_TRUE(e.Has("metronome_unknown"));
  EXPECT_EQ(e.Value("metronome_ns:with_colon"), 2.5);
  EXPECT_EQ(e.Value("metronome_lat_ms_count", {{"path", nasty}}), 6.0);
  EXPECT_EQ(e.Value("metronome_lat_ms_bucket", {{"path", nasty}, {"le", "1"}}), 2.0);
  EXPECT_EQ(e.Value("metronome_lat_ms_bucket", {{"path", nasty}, {"le", "5000"}}), 5.0);
  EXPECT_EQ(e.Value("metronome_lat_ms_sum", {{"path", nasty}}),
            0.1 + 1.0 + 3.0 + 45.0 + 99.0 + 7000.0);
  EXPECT_EQ(e.Value("metronome_lat_ms_count", {{"path", "empty"}}), 0.0);
  EXPECT_EQ(e.Value("metronome_only_inf_count"), 1.0);
  EXPECT_EQ(e.Value("metronome_only_inf_sum"), -1.0);
}

TEST(MetricsRegistryTest, WithLabelsReturnsTheSameChild) {
  MetricsRegistry registry;
  Family<Gauge>& family = registry.AddGaugeFamily("g", "G.", {"a", "b"});
  Gauge& first = family.WithLabels({"x", "y"});
  family.WithLabels({"y", "x"});
  family.WithLabels({"z", "z"});
  const std::vector<std::string> values = {"x", "y"};
  EXPECT_EQ(&family.WithLabels(values), &first);
  EXPECT_EQ(family.name(), "metronome_g");
  ASSERT_EQ(family.label_names().size(), 2u);
}

TEST(MetricsRegistryDeathTest, WrongNumberOfLabelValuesIsABug) {
  MetricsRegistry registry;
  Family<Counter>& family = registry.AddCounterFamily("c_total", "C.", {"a"});
  EXPECT_DEATH(family.WithLabels({"x", "y"}), "label");
}

TEST(MetricsRegistryTest, HistogramBucketsAreInclusiveUpperBounds) {
  MetricsRegistry registry;
  Histogram& h = registry.AddHistogram("h", "H.", {1, 2, 3});
  for (double v : {-10.0, 1.0, 1.5, 2.0, 3.0, 3.0001, kInf}) h.Observe(v);
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<std::uint64_t>{2, 4, 5, 7}));
  EXPECT_EQ(h.sum(), kInf);
}

TEST(MetricsRegistryTest, ConcurrentUpdatesSumExactly) {
  MetricsRegistry registry;
  Counter& counter = registry.AddCounter("hits_total", "Hits.");
  Counter& real = registry.AddCounter("half_total", "Halves.");
  Gauge& gauge = registry.AddGauge("level", "Level.");
  Histogram& histogram = registry.AddHistogram("obs", "Observations.", {10, 100});
  constexpr int kPerThread = 200000;
  const auto work = [&](int thread) {
    for (int i = 0; i < kPerThread; ++i) {
      counter.Inc();
      real.Add(0.5);  // exact in binary, so the double sum is exact too
      gauge.Add(1.0);
      histogram.Observe(thread == 0 ? 5.0 : 50.0);
    }
  };
  std::thread a(work, 0);
  std::thread b(work, 1);
  // Scrapes while the writers run must stay well-formed.
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(ValidateExposition(registry.ExpositionText(), nullptr), "");
  }
  a.join();
  b.join();
  EXPECT_EQ(counter.value(), 2.0 * kPerThread);
  EXPECT_EQ(real.value(), 1.0 * kPerThread);
  EXPECT_EQ(gauge.value(), 2.0 * kPerThread);
  EXPECT_EQ(histogram.CumulativeCounts(),
            (std::vector<std::uint64_t>{kPerThread, 2 * kPerThread, 2 * kPerThread}));
  EXPECT_EQ(histogram.sum(), 55.0 * kPerThread);
}

TEST(MetricsRegistryTest, CounterKeepsLargeIntegersExact) {
  MetricsRegistry registry;
  Counter& c = registry.AddCounter("big_total", "Big.");
  c.Inc((std::uint64_t{1} << 60) + 1);
  EXPECT_NE(registry.ExpositionText().find("metronome_big_total 1152921504606846977\n"),
            std::string::npos);
}

TEST(MetricsRegistryTest, InvalidOrDuplicateNamesThrowConfigError) {
  MetricsRegistry registry;
  EXPECT_THROW(registry.AddGauge("", "x"), ConfigError);
  EXPECT_THROW(registry.AddGauge("a-b", "x"), ConfigError);
  EXPECT_THROW(registry.AddGauge("a b", "x"), ConfigError);
  EXPECT_THROW(registry.AddGauge("caf\xc3\xa9", "x"), ConfigError);
  EXPECT_THROW(registry.AddCounter("requests", "x"), ConfigError);  // no _total
  EXPECT_THROW(registry.AddGaugeFamily("g1", "x", {"1abc"}), ConfigError);
  EXPECT_THROW(registry.AddGaugeFamily("g2", "x", {"a:b"}), ConfigError);
  EXPECT_THROW(registry.AddGaugeFamily("g3", "x", {"__reserved"}), ConfigError);
  EXPECT_THROW(registry.AddGaugeFamily("g4", "x", {"a", "a"}), ConfigError);
  EXPECT_THROW(registry.AddHistogramFamily("h1", "x", {"le"}, {1}), ConfigError);
  EXPECT_THROW(registry.AddHistogram("h2", "x", {2, 1}), ConfigError);
  EXPECT_THROW(registry.AddHistogram("h3", "x", {1, 1}), ConfigError);
  EXPECT_THROW(registry.AddHistogram("h4", "x", {1, kInf}), ConfigError);
  EXPECT_THROW(registry.AddHistogram("h5", "x", {std::numeric_limits<double>::quiet_NaN()}),
               ConfigError);
  EXPECT_THROW(std::ignore = ExponentialBuckets(0, 2, 3), ConfigError);
  EXPECT_THROW(std::ignore = ExponentialBuckets(1, 1, 3), ConfigError);

  registry.AddGauge("taken", "x");
  EXPECT_THROW(registry.AddGauge("taken", "x"), ConfigError);
  EXPECT_THROW(registry.AddHistogram("taken", "x", {1}), ConfigError);
  registry.AddHistogram("lat", "x", {1});
  EXPECT_THROW(registry.AddGauge("lat_count", "x"), ConfigError);
  EXPECT_NO_THROW(registry.AddCounter("lat_bucket_total", "x"));  // differs from lat_bucket
  // A registration that failed reserved nothing.
  EXPECT_NO_THROW(registry.AddGaugeFamily("g1", "x", {"ok"}));
}

TEST(MetricsRegistryTest, WriteExpositionFileReplacesTheFileAtomically) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("metronome_metrics_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "metrics.prom").string();
  const auto read = [&] {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  MetricsRegistry registry;
  Counter& c = registry.AddCounter("writes_total", "Writes.");
  registry.WriteExpositionFile(path);
  EXPECT_EQ(read(), registry.ExpositionText());
  c.Inc();
  registry.WriteExpositionFile(path);
  EXPECT_EQ(read(), registry.ExpositionText());
  EXPECT_NE(read().find("metronome_writes_total 1\n"), std::string::npos);
  // Only the target remains: the temporary file was renamed over it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1);
  EXPECT_THROW(registry.WriteExpositionFile((dir / "missing" / "m.prom").string()), ConfigError);
  std::filesystem::remove_all(dir);
}

// ---- EngineMetrics ----

TEST(EngineMetricsTest, ExposesEveryEngineMetricAsValidText) {
  MetricsRegistry registry;
  const EngineMetrics m(registry);
  m.frame_latency_ms.Observe(35.0);
  m.frame_latency_ms.Observe(95.0);
  m.frames(FrameOutcome::kOk).Inc();
  m.frames(FrameOutcome::kLate).Inc();
  m.deadline_misses.Inc();
  m.mute_alarms.Inc();
  m.tokens_per_frame.Observe(0);
  m.tokens_per_frame.Observe(3);
  m.iteration_ms.Observe(12.5);
  m.batch_tokens.Observe(40);
  m.kv_blocks_used.Set(120);
  m.kv_blocks_free.Set(904);
  m.session_resident_blocks.Observe(17);
  m.kv_blocks_freed_by_window.Inc(4);
  EXPECT_EQ(m.admission_limit.value(), kInf);  // no limit until told
  EXPECT_EQ(m.admission_headroom.value(), kInf);
  m.SetAdmissionCapacity(/*limit=*/32, /*work_used=*/29.3, /*whole_units_used=*/30);
  m.sessions_active.Set(30);
  m.sessions_admitted.Inc(31);
  m.sessions_rejected("limit").Inc();
  EXPECT_EQ(&m.sessions_rejected("limit"), &m.sessions_rejected("limit"));

  Exposition e;
  const std::string text = registry.ExpositionText();
  ASSERT_EQ(ValidateExposition(text, &e), "") << text;
  EXPECT_EQ(e.Value("metronome_saturation_forecast_seconds"), kInf);  // "never" until told
  for (const char* outcome : {"ok", "late", "starved", "short"}) {
    EXPECT_TRUE(e.Has("metronome_frames_total", {{"outcome", outcome}})) << outcome;
  }
  EXPECT_EQ(e.Value("metronome_frames_total", {{"outcome", "late"}}), 1.0);
  EXPECT_EQ(e.Value("metronome_frames_total", {{"outcome", "starved"}}), 0.0);
  EXPECT_EQ(e.Value("metronome_frame_latency_ms_bucket", {{"le", "40"}}), 1.0);
  EXPECT_EQ(e.Value("metronome_frame_latency_ms_count"), 2.0);
  EXPECT_EQ(e.Value("metronome_tokens_per_frame_bucket", {{"le", "0"}}), 1.0);
  EXPECT_EQ(e.Value("metronome_kv_blocks_free"), 904.0);
  EXPECT_EQ(e.Value("metronome_admission_limit"), 32.0);
  EXPECT_EQ(e.Value("metronome_admission_headroom"), 2.0);
  EXPECT_EQ(e.Value("metronome_admission_work_used"), 29.3);
  EXPECT_EQ(e.Value("metronome_kv_blocks_freed_by_window_total"), 4.0);
  EXPECT_EQ(e.Value("metronome_sessions_rejected_total", {{"reason", "limit"}}), 1.0);
  for (const char* name : {"metronome_frame_latency_ms",
                           "metronome_frames_total",
                           "metronome_deadline_misses_total",
                           "metronome_mute_alarms_total",
                           "metronome_tokens_per_frame",
                           "metronome_iteration_ms",
                           "metronome_batch_tokens",
                           "metronome_kv_blocks_used",
                           "metronome_kv_blocks_free",
                           "metronome_session_resident_blocks",
                           "metronome_kv_blocks_freed_by_window_total",
                           "metronome_admission_limit",
                           "metronome_admission_headroom",
                           "metronome_admission_work_used",
                           "metronome_sessions_active",
                           "metronome_sessions_admitted_total",
                           "metronome_sessions_rejected_total",
                           "metronome_saturation_forecast_seconds",
                           "metronome_engine_busy_fraction",
                           "metronome_engine_work_utilization"}) {
    EXPECT_TRUE(e.types.contains(name)) << name;
  }

  m.SetSaturationForecastSeconds(12.5);
  EXPECT_EQ(m.saturation_forecast_seconds.value(), 12.5);
  m.SetSaturationForecastSeconds(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(m.saturation_forecast_seconds.value(), kInf);
  m.SetAdmissionCapacity(/*limit=*/4, /*work_used=*/6.0,
                         /*whole_units_used=*/6);  // a limit cut below the active count
  EXPECT_EQ(m.admission_headroom.value(), 0.0);
  m.SetAdmissionCapacity(/*limit=*/-1, 6, 6);
  EXPECT_EQ(m.admission_limit.value(), kInf);
  EXPECT_EQ(m.admission_headroom.value(), kInf);
  EXPECT_THROW(EngineMetrics{registry}, ConfigError);  // already registered
}

}  // namespace
}  // namespace metronome::telemetry
