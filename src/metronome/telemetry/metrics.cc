#include "metronome/telemetry/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include "metronome/base/check.h"
#include "metronome/base/errors.h"

namespace metronome::telemetry {
namespace {

bool IsNameStart(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
}
bool IsNameChar(char c, bool allow_colon) {
  return IsNameStart(c, allow_colon) || (c >= '0' && c <= '9');
}
bool IsValidName(std::string_view s, bool allow_colon) {
  if (s.empty() || !IsNameStart(s.front(), allow_colon)) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return IsNameChar(c, allow_colon); });
}

// Shortest decimal that parses back to v; Prometheus spellings for the non-finite values.
void AppendDouble(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
    return;
  }
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  MTR_CHECK(ec == std::errc(), "to_chars(double) failed");
  out.append(buf, end);
}

void AppendUint(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  MTR_CHECK(ec == std::errc(), "to_chars(uint64) failed");
  out.append(buf, end);
}

// HELP text escapes backslash and newline; label values additionally escape the double quote.
void AppendEscaped(std::string& out, std::string_view s, bool quote) {
  for (const char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

// `{a="x",b="y"` plus optional extra label (histogram "le"), then `}`; nothing when there are no
// labels at all.
void AppendLabels(std::string& out, std::span<const std::string> names,
                  const std::vector<std::string>& values, std::string_view extra_name = {},
                  std::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return;
  out += '{';
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i];
    out += "=\"";
    AppendEscaped(out, values[i], /*quote=*/true);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
}

template <typename Metric>
constexpr std::string_view TypeName() {
  if constexpr (std::is_same_v<Metric, Counter>) {
    return "counter";
  } else if constexpr (std::is_same_v<Metric, Gauge>) {
    return "gauge";
  } else {
    static_assert(std::is_same_v<Metric, Histogram>);
    return "histogram";
  }
}

[[noreturn]] void ThrowLabelError(std::string_view metric, std::string_view label,
                                  std::string_view problem) {
  std::string message = "metric '";
  message.append(metric).append("': label name '").append(label).append("' ").append(problem);
  throw ConfigError(message);
}

void ValidateBounds(std::string_view name, std::span<const double> bounds) {
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      throw ConfigError("histogram " + std::string(name) +
                        ": bucket bounds must be finite (+Inf is implicit)");
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      throw ConfigError("histogram " + std::string(name) +
                        ": bucket bounds must be strictly increasing");
    }
  }
}

}  // namespace

std::vector<double> DefaultLatencyBucketsMs() {
  return {1, 2, 5, 10, 20, 40, 60, 80, 100, 150, 200, 300, 500, 1000, 2000, 5000};
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0.0) || !(factor > 1.0) || count < 1 || !std::isfinite(start * factor)) {
    throw ConfigError("ExponentialBuckets: need start > 0, factor > 1, count >= 1");
  }
  std::vector<double> bounds;
  bounds.reserve(static_cast<std::size_t>(count));
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) bounds.push_back(b);
  return bounds;
}

// ---- Counter ----

double Counter::value() const noexcept {
  return static_cast<double>(integer_.load(std::memory_order_relaxed)) +
         real_.load(std::memory_order_relaxed);
}

void Counter::AppendValue(std::string& out) const {
  const std::uint64_t integer = integer_.load(std::memory_order_relaxed);
  const double real = real_.load(std::memory_order_relaxed);
  if (real == 0.0) {
    AppendUint(out, integer);
  } else {
    AppendDouble(out, static_cast<double>(integer) + real);
  }
}

// ---- Histogram ----

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      bucket_counts_(std::make_unique<std::atomic<std::uint64_t>[]>(upper_bounds_.size() + 1)) {}

void Histogram::Observe(double v) noexcept {
  if (std::isnan(v)) return;
  // First bound >= v: "le" is inclusive.
  const auto it = std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), v);
  const auto bucket = static_cast<std::size_t>(it - upper_bounds_.begin());
  bucket_counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

std::vector<std::uint64_t> Histogram::CumulativeCounts() const {
  std::vector<std::uint64_t> counts(upper_bounds_.size() + 1);
  std::uint64_t running = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    running += bucket_counts_[i].load(std::memory_order_relaxed);
    counts[i] = running;
  }
  return counts;
}

// ---- Family ----

template <typename Metric>
Family<Metric>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                       std::vector<double> upper_bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      upper_bounds_(std::move(upper_bounds)) {}

template <typename Metric>
Metric& Family<Metric>::WithLabels(std::initializer_list<std::string_view> values) {
  return Child(std::vector<std::string>(values.begin(), values.end()));
}

template <typename Metric>
Metric& Family<Metric>::WithLabels(std::span<const std::string> values) {
  return Child(std::vector<std::string>(values.begin(), values.end()));
}

template <typename Metric>
Metric& Family<Metric>::Child(std::vector<std::string> values) {
  MTR_CHECK(values.size() == label_names_.size(),
            "WithLabels: number of label values differs from the family's label names");
  const base::MutexLock lock(&mu_);
  auto it = children_.find(values);
  if (it == children_.end()) {
    std::unique_ptr<Metric> child;
    if constexpr (std::is_same_v<Metric, Histogram>) {
      child = std::make_unique<Histogram>(upper_bounds_);
    } else {
      child = std::make_unique<Metric>();
    }
    it = children_.emplace(std::move(values), std::move(child)).first;
  }
  return *it->second;
}

template <typename Metric>
void Family<Metric>::AppendTo(std::string& out) const {
  out += "# HELP ";
  out += name_;
  out += ' ';
  AppendEscaped(out, help_, /*quote=*/false);
  out += "\n# TYPE ";
  out += name_;
  out += ' ';
  out += TypeName<Metric>();
  out += '\n';

  const base::MutexLock lock(&mu_);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<Metric, Histogram>) {
      const std::vector<std::uint64_t> cumulative = child->CumulativeCounts();
      std::string le;
      for (std::size_t i = 0; i < cumulative.size(); ++i) {
        le.clear();
        if (i < upper_bounds_.size()) {
          AppendDouble(le, upper_bounds_[i]);
        } else {
          le = "+Inf";
        }
        out += name_;
        out += "_bucket";
        AppendLabels(out, label_names_, values, "le", le);
        out += ' ';
        AppendUint(out, cumulative[i]);
        out += '\n';
      }
      out += name_;
      out += "_sum";
      AppendLabels(out, label_names_, values);
      out += ' ';
      AppendDouble(out, child->sum());
      out += '\n';
      out += name_;
      out += "_count";
      AppendLabels(out, label_names_, values);
      out += ' ';
      AppendUint(out, cumulative.back());
      out += '\n';
    } else {
      out += name_;
      AppendLabels(out, label_names_, values);
      out += ' ';
      if constexpr (std::is_same_v<Metric, Counter>) {
        child->AppendValue(out);
      } else {
        AppendDouble(out, child->value());
      }
      out += '\n';
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- MetricsRegistry ----

std::string MetricsRegistry::Reserve(std::string_view name, std::string_view kind,
                                     std::span<const std::string> label_names) {
  std::string full(kMetricPrefix);
  full += name;
  if (name.empty() || !IsValidName(full, /*allow_colon=*/true)) {
    throw ConfigError("metric name '" + full + "' is not a valid Prometheus name");
  }
  if (kind == "counter" && !full.ends_with("_total")) {
    throw ConfigError("counter '" + full + "' must end in _total");
  }
  for (std::size_t i = 0; i < label_names.size(); ++i) {
    const std::string& label = label_names[i];
    if (!IsValidName(label, /*allow_colon=*/false) || label.starts_with("__")) {
      ThrowLabelError(full, label, "is not valid");
    }
    if (kind == "histogram" && label == "le") {
      throw ConfigError("histogram '" + full + "': label name 'le' is reserved");
    }
    if (std::find(label_names.begin(), label_names.begin() + static_cast<std::ptrdiff_t>(i),
                  label) != label_names.begin() + static_cast<std::ptrdiff_t>(i)) {
      ThrowLabelError(full, label, "is repeated");
    }
  }
  std::vector<std::string> exposed = {full};
  if (kind == "histogram") {
    exposed = {full, full + "_bucket", full + "_sum", full + "_count"};
  }
  for (const std::string& n : exposed) {
    if (taken_names_.contains(n)) {
      throw ConfigError("metric name '" + n + "' is already registered");
    }
  }
  taken_names_.insert(exposed.begin(), exposed.end());
  return full;
}

Counter& MetricsRegistry::AddCounter(std::string_view name, std::string_view help) {
  return AddCounterFamily(name, help, {}).WithLabels({});
}

Gauge& MetricsRegistry::AddGauge(std::string_view name, std::string_view help) {
  return AddGaugeFamily(name, help, {}).WithLabels({});
}

Histogram& MetricsRegistry::AddHistogram(std::string_view name, std::string_view help,
                                         std::vector<double> upper_bounds) {
  return AddHistogramFamily(name, help, {}, std::move(upper_bounds)).WithLabels({});
}

template <typename Metric>
Family<Metric>& MetricsRegistry::AddFamily(std::string_view name, std::string_view kind,
                                           std::string_view help,
                                           std::vector<std::string> label_names,
                                           std::vector<double> upper_bounds) {
  std::string full = Reserve(name, kind, label_names);
  // Family's constructor is private to the registry, so no make_unique.
  auto family = std::unique_ptr<Family<Metric>>(new Family<Metric>(
      std::move(full), std::string(help), std::move(label_names), std::move(upper_bounds)));
  Family<Metric>& ref = *family;
  families_.emplace_back(std::move(family));
  return ref;
}

Family<Counter>& MetricsRegistry::AddCounterFamily(std::string_view name, std::string_view help,
                                                   std::vector<std::string> label_names) {
  const base::MutexLock lock(&mu_);
  return AddFamily<Counter>(name, "counter", help, std::move(label_names), {});
}

Family<Gauge>& MetricsRegistry::AddGaugeFamily(std::string_view name, std::string_view help,
                                               std::vector<std::string> label_names) {
  const base::MutexLock lock(&mu_);
  return AddFamily<Gauge>(name, "gauge", help, std::move(label_names), {});
}

Family<Histogram>& MetricsRegistry::AddHistogramFamily(std::string_view name, std::string_view help,
                                                       std::vector<std::string> label_names,
                                                       std::vector<double> upper_bounds) {
  const base::MutexLock lock(&mu_);
  ValidateBounds(std::string(kMetricPrefix) + std::string(name), upper_bounds);
  return AddFamily<Histogram>(name, "histogram", help, std::move(label_names),
                              std::move(upper_bounds));
}

std::string MetricsRegistry::ExpositionText() const {
  std::string out;
  const base::MutexLock lock(&mu_);
  for (const AnyFamily& family : families_) {
    std::visit([&out](const auto& f) { f->AppendTo(out); }, family);
  }
  return out;
}

void MetricsRegistry::WriteExpositionFile(const std::string& path) const {
  const std::string text = ExpositionText();
  // Unique per process and call, so concurrent writers never share a temporary file.
  static std::atomic<std::uint64_t> sequence{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(sequence.fetch_add(1, std::memory_order_relaxed));
  const auto fail = [&](const char* what, int err) {
    throw ConfigError("cannot write metrics file '" + path + "' (" + what + " " + tmp +
                      "): " + ErrnoMessage(err));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open", errno);
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail("write", err);
    }
    written += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("close", err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("rename", err);
  }
}

}  // namespace metronome::telemetry
