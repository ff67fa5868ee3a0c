// Metrics registry with Prometheus text exposition (format 0.0.4): counters, gauges and
// fixed-bucket histograms, optionally split by labels. Registration and the first WithLabels() of a
// label set are cold-path (they allocate, lock and may throw ConfigError); once a caller holds a
// Counter&/Gauge&/Histogram&, updating it is lock-free and allocation-free, so the frame loop may
// do it. Thread-safety: every method may be called from any thread; ExpositionText() may run while
// other threads update metrics (each sample is read atomically; a scrape is not one snapshot).
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "metronome/base/thread_annotations.h"

namespace metronome::telemetry {

// Every exposed metric name is this prefix + the name given at registration.
inline constexpr std::string_view kMetricPrefix = "metronome_";

// Upper bounds (ms) for frame/iteration latency histograms: 1, 2, 5, 10, 20, 40, 60, 80, 100, 150,
// 200, 300, 500, 1000, 2000, 5000. Dense around the 40-100 ms frame periods of speech models.
[[nodiscard]] std::vector<double> DefaultLatencyBucketsMs();

// `count` upper bounds start, start*factor, start*factor^2, ... Requires start > 0, factor > 1,
// count >= 1 (ConfigError otherwise).
[[nodiscard]] std::vector<double> ExponentialBuckets(double start, double factor, int count);

// A monotonic count. Integer increments are exact up to 2^64; Add() accumulates a separate double
// so fractional amounts (seconds, ms) can be counted too. The exposed value is their sum.
class Counter {
 public:
  void Inc() noexcept { integer_.fetch_add(1, std::memory_order_relaxed); }
  void Inc(std::uint64_t n) noexcept { integer_.fetch_add(n, std::memory_order_relaxed); }
  // Adds v; v <= 0 and NaN are ignored, since a counter never goes down.
  void Add(double v) noexcept {
    if (v > 0.0) real_.fetch_add(v, std::memory_order_relaxed);
  }
  [[nodiscard]] double value() const noexcept;

 private:
  template <typename>
  friend class Family;
  // Exact decimal when no real part was added (uint64 values above 2^53 stay exact).
  void AppendValue(std::string& out) const;

  std::atomic<std::uint64_t> integer_{0};
  std::atomic<double> real_{0.0};
};

// A value that goes up and down. Any double is allowed, including +Inf ("never", e.g. a saturation
// forecast with no saturation in sight) and NaN ("unknown").
class Gauge {
 public:
  void Set(double v) noexcept { value_.store(v, std::memory_order_relaxed); }
  void Add(double v) noexcept { value_.fetch_add(v, std::memory_order_relaxed); }
  [[nodiscard]] double value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Distribution over fixed buckets. Bucket i counts observations v with upper_bounds[i-1] < v <=
// upper_bounds[i]; one more bucket (+Inf) takes everything above the last bound. Exposition turns
// them into Prometheus' cumulative counts, and _count is the +Inf cumulative count, so the two
// always agree even while other threads observe.
// Invariants: upper_bounds() is finite and strictly increasing (checked at registration).
class Histogram {
 public:
  // Use MetricsRegistry::AddHistogram*, which validates the bounds.
  explicit Histogram(std::vector<double> upper_bounds);

  // Records v. NaN is dropped (it has no bucket and would poison _sum). O(log buckets), no locks,
  // no allocation.
  void Observe(double v) noexcept;

  [[nodiscard]] std::span<const double> upper_bounds() const { return upper_bounds_; }
  // Cumulative counts per bound, then the +Inf bucket (= total count); size
  // upper_bounds().size()+1.
  [[nodiscard]] std::vector<std::uint64_t> CumulativeCounts() const;
  [[nodiscard]] double sum() const noexcept { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> upper_bounds_;
  // [upper_bounds_.size() + 1], non-cumulative; the last is the +Inf overflow bucket.
  std::unique_ptr<std::atomic<std::uint64_t>[]> bucket_counts_;
  std::atomic<double> sum_{0.0};
};

// All metrics of one name, one child metric per distinct tuple of label values. Children live as
// long as the registry and never move, so references from WithLabels() stay valid.
template <typename Metric>
class Family {
 public:
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // The child for these label values (one per label name, in registration order), created on first
  // use. Takes the family's lock and allocates: call it once and keep the reference. A wrong number
  // of values is a bug (MTR_CHECK). Values may be any bytes; exposition escapes them.
  Metric& WithLabels(std::initializer_list<std::string_view> values);
  Metric& WithLabels(std::span<const std::string> values);

  [[nodiscard]] const std::string& name() const { return name_; }  // with kMetricPrefix
  [[nodiscard]] std::span<const std::string> label_names() const { return label_names_; }

 private:
  friend class MetricsRegistry;
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> upper_bounds);
  Metric& Child(std::vector<std::string> values);
  void AppendTo(std::string& out) const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> upper_bounds_;  // histograms only
  mutable base::Mutex mu_;
  // Label values -> child; std::map so exposition order is deterministic.
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> children_ GUARDED_BY(mu_);
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

// Owns every metric family. Names are checked against the Prometheus grammar
// ([a-zA-Z_:][a-zA-Z0-9_:]*, labels [a-zA-Z_][a-zA-Z0-9_]* and not starting with "__"); counter
// names must end in "_total"; a name (or a histogram's derived _bucket/_sum/_count name) that is
// already taken is rejected. All of these throw ConfigError naming the metric.
class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // `name` excludes kMetricPrefix; `help` is free text (escaped on output).
  Counter& AddCounter(std::string_view name, std::string_view help);
  Gauge& AddGauge(std::string_view name, std::string_view help);
  Histogram& AddHistogram(std::string_view name, std::string_view help,
                          std::vector<double> upper_bounds);

  Family<Counter>& AddCounterFamily(std::string_view name, std::string_view help,
                                    std::vector<std::string> label_names);
  Family<Gauge>& AddGaugeFamily(std::string_view name, std::string_view help,
                                std::vector<std::string> label_names);
  // "le" is reserved for the bucket label and cannot be a label name here.
  Family<Histogram>& AddHistogramFamily(std::string_view name, std::string_view help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> upper_bounds);

  // Prometheus text format 0.0.4 (Content-Type "text/plain; version=0.0.4"): families in
  // registration order, children sorted by label values, every line ending in '\n'.
  [[nodiscard]] std::string ExpositionText() const;

  // Writes ExpositionText() to `path` atomically: a temporary file in the same directory, then
  // rename(), so a reader (e.g. node_exporter's textfile collector) never sees a partial file.
  // Throws ConfigError naming the path when the file cannot be written.
  void WriteExpositionFile(const std::string& path) const;

 private:
  using AnyFamily = std::variant<std::unique_ptr<Family<Counter>>, std::unique_ptr<Family<Gauge>>,
                                 std::unique_ptr<Family<Histogram>>>;

  // Reserves the names of a family of `kind` ("counter", "gauge", "histogram") and owns it;
  // `upper_bounds` are already validated (histograms) or empty.
  template <typename Metric>
  Family<Metric>& AddFamily(std::string_view name, std::string_view kind, std::string_view help,
                            std::vector<std::string> label_names, std::vector<double> upper_bounds)
      REQUIRES(mu_);

  // Validates and reserves the exposed names; returns the full name.
  std::string Reserve(std::string_view name, std::string_view kind,
                      std::span<const std::string> label_names) REQUIRES(mu_);

  mutable base::Mutex mu_;
  std::vector<AnyFamily> families_ GUARDED_BY(mu_);                 // registration order
  std::set<std::string, std::less<>> taken_names_ GUARDED_BY(mu_);  // every exposed sample name
};

}  // namespace metronome::telemetry
