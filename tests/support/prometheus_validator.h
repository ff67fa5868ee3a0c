// An independent checker for the Prometheus text exposition format 0.0.4, shared by tests that
// scrape the registry. Test-only; header-only.
#pragma once

#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace metronome::test_support {

inline constexpr double kExpositionInf = std::numeric_limits<double>::infinity();

//// Written from the format description, not from the registry's code: line grammar, escapes,
/// number
// spellings, TYPE before a family's samples, a family's samples contiguous, no duplicate series,
// histograms cumulative with a final +Inf bucket equal to _count.

using Labels = std::map<std::string, std::string>;

struct Sample {
  std::string name;
  Labels labels;
  double value = 0.0;
};

struct Exposition {
  std::map<std::string, std::string> types;  // family name -> type
  std::map<std::string, std::string> help;   // family name -> unescaped help
  std::vector<Sample> samples;

  // The value of the one sample with this name and labels; NaN if absent.
  [[nodiscard]] double Value(std::string_view name, const Labels& labels = {}) const {
    for (const Sample& s : samples) {
      if (s.name == name && s.labels == labels) return s.value;
    }
    return std::numeric_limits<double>::quiet_NaN();
  }
  [[nodiscard]] bool Has(std::string_view name, const Labels& labels = {}) const {
    for (const Sample& s : samples) {
      if (s.name == name && s.labels == labels) return true;
    }
    return false;
  }
};

inline bool IsNameStart(char c, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}
inline bool IsNameChar(char c, bool colon) {
  return IsNameStart(c, colon) || (c >= '0' && c <= '9');
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}
  [[nodiscard]] bool AtEnd() const { return pos_ >= s_.size(); }
  [[nodiscard]] char Peek() const { return AtEnd() ? '\0' : s_[pos_]; }
  bool Consume(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  bool Name(bool colon, std::string* out) {
    if (!IsNameStart(Peek(), colon)) return false;
    const std::size_t start = pos_;
    while (!AtEnd() && IsNameChar(Peek(), colon)) ++pos_;
    *out = std::string(s_.substr(start, pos_ - start));
    return true;
  }
  // Up to the next space (or end).
  std::string_view Token() {
    const std::size_t start = pos_;
    while (!AtEnd() && Peek() != ' ') ++pos_;
    return s_.substr(start, pos_ - start);
  }
  std::string_view Rest() {
    const std::string_view r = s_.substr(pos_);
    pos_ = s_.size();
    return r;
  }
  // Unescapes a quoted label value; the opening quote is already consumed.
  bool QuotedValue(std::string* out) {
    out->clear();
    while (!AtEnd()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (c == '\\') {
        if (AtEnd()) return false;
        const char e = s_[pos_++];
        if (e == '\\') {
          *out += '\\';
        } else if (e == '"') {
          *out += '"';
        } else if (e == 'n') {
          *out += '\n';
        } else {
          return false;
        }
      } else {
        *out += c;
      }
    }
    return false;
  }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;
};

inline bool ParseNumber(std::string_view t, double* out) {
  if (t == "+Inf" || t == "Inf") {
    *out = kExpositionInf;
    return true;
  }
  if (t == "-Inf") {
    *out = -kExpositionInf;
    return true;
  }
  if (t == "NaN") {
    *out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  if (t.empty()) return false;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), *out);
  return ec == std::errc() && end == t.data() + t.size() && std::isfinite(*out);
}

inline bool UnescapeHelp(std::string_view s, std::string* out) {
  out->clear();
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      *out += s[i];
      continue;
    }
    if (++i == s.size()) return false;
    if (s[i] == '\\') {
      *out += '\\';
    } else if (s[i] == 'n') {
      *out += '\n';
    } else {
      return false;
    }
  }
  return true;
}

inline std::string SeriesKey(const std::string& name, const Labels& labels) {
  std::string key = name;
  for (const auto& [k, v] : labels) key.append("\x1f").append(k).append("=").append(v);
  return key;
}

// Family a sample belongs to, given the TYPEs seen so far; empty if none.
inline std::string FamilyOf(const std::string& name,
                            const std::map<std::string, std::string>& types) {
  if (types.contains(name)) return name;
  for (const std::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (name.size() > suffix.size() && name.ends_with(suffix)) {
      std::string base = name.substr(0, name.size() - suffix.size());
      const auto it = types.find(base);
      if (it != types.end() &&
          (it->second == "histogram" || (it->second == "summary" && suffix != "_bucket"))) {
        return base;
      }
    }
  }
  return {};
}

inline std::string CheckHistograms(const Exposition& e) {
  for (const auto& [family, type] : e.types) {
    if (type != "histogram") continue;
    struct Series {
      std::vector<std::pair<double, double>> buckets;  // (le, cumulative count) in text order
      bool has_sum = false;
      bool has_count = false;
      double count = 0.0;
    };
    std::map<std::string, Series> series;  // keyed by labels without le
    for (const Sample& s : e.samples) {
      Labels labels = s.labels;
      if (s.name == family + "_bucket") {
        const auto le = labels.find("le");
        if (le == labels.end()) return s.name + ": bucket without le";
        double bound = 0.0;
        if (!ParseNumber(le->second, &bound)) return s.name + ": bad le '" + le->second + "'";
        labels.erase(le);
        series[SeriesKey("", labels)].buckets.emplace_back(bound, s.value);
      } else if (s.name == family + "_sum") {
        series[SeriesKey("", labels)].has_sum = true;
      } else if (s.name == family + "_count") {
        Series& x = series[SeriesKey("", labels)];
        x.has_count = true;
        x.count = s.value;
      } else if (s.name == family) {
        return family + ": histogram with a bare sample";
      }
    }
    for (const auto& [key, x] : series) {
      if (x.buckets.empty()) return family + ": series without buckets";
      for (std::size_t i = 1; i < x.buckets.size(); ++i) {
        if (!(x.buckets[i].first > x.buckets[i - 1].first)) {
          return family + ": le not increasing";
        }
        if (x.buckets[i].second < x.buckets[i - 1].second) {
          return family + ": bucket counts not cumulative";
        }
      }
      if (x.buckets.back().first != kExpositionInf) return family + ": no +Inf bucket";
      if (!x.has_sum || !x.has_count) return family + ": missing _sum or _count";
      if (x.buckets.back().second != x.count) return family + ": +Inf bucket != _count";
    }
  }
  return {};
}

// Returns an empty string when `text` is valid, else the first problem found (with its line).
inline std::string ValidateExposition(std::string_view text, Exposition* out) {
  Exposition e;
  if (!text.empty() && text.back() != '\n') return "text does not end in a newline";
  std::set<std::string> finished_families;
  std::set<std::string> series_seen;
  std::string current_family;
  int line_no = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    ++line_no;
    const std::string where = "line " + std::to_string(line_no) + " '" + std::string(line) + "': ";
    if (line.empty()) continue;
    Parser p(line);
    if (p.Consume('#')) {
      if (!p.Consume(' ')) continue;  // plain comment
      const std::string_view keyword = p.Token();
      if (keyword != "HELP" && keyword != "TYPE") continue;
      std::string name;
      if (!p.Consume(' ') || !p.Name(true, &name)) return where + "bad metric name";
      if (keyword == "HELP") {
        std::string help;
        if (!p.AtEnd() && !p.Consume(' ')) return where + "no space after name";
        if (!UnescapeHelp(p.Rest(), &help)) return where + "bad escape in HELP";
        if (!e.help.emplace(name, help).second) return where + "second HELP";
      } else {
        if (!p.Consume(' ')) return where + "no type";
        const std::string type(p.Rest());
        static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary",
                                                     "untyped"};
        if (!kTypes.contains(type)) return where + "unknown type";
        if (e.types.contains(name)) return where + "second TYPE";
        if (finished_families.contains(name) || name == current_family) {
          return where + "TYPE after samples";
        }
        e.types.emplace(name, type);
      }
      continue;
    }
    Sample s;
    if (!p.Name(true, &s.name)) return where + "bad metric name";
    if (p.Consume('{')) {
      while (!p.Consume('}')) {
        std::string label;
        std::string value;
        if (!p.Name(false, &label)) return where + "bad label name";
        if (!p.Consume('=') || !p.Consume('"')) return where + "expected =\"";
        if (!p.QuotedValue(&value)) return where + "bad label value";
        if (!s.labels.emplace(label, value).second) return where + "repeated label";
        if (!p.Consume(',') && p.Peek() != '}') return where + "expected , or }";
      }
    }
    if (!p.Consume(' ')) return where + "no space before value";
    while (p.Consume(' ')) {
    }
    if (!ParseNumber(p.Token(), &s.value)) return where + "bad value";
    if (p.Consume(' ')) {
      const std::string_view ts = p.Token();
      std::int64_t t = 0;
      const auto [end, ec] = std::from_chars(ts.data(), ts.data() + ts.size(), t);
      if (ec != std::errc() || end != ts.data() + ts.size()) return where + "bad timestamp";
    }
    if (!p.AtEnd()) return where + "trailing characters";

    const std::string family = FamilyOf(s.name, e.types);
    if (family.empty()) return where + "sample before its TYPE";
    if (family != current_family) {
      if (finished_families.contains(family)) return where + "family not contiguous";
      if (!current_family.empty()) finished_families.insert(current_family);
      current_family = family;
    }
    if (e.types[family] == "counter" && !(s.value >= 0.0)) return where + "negative counter";
    if (!series_seen.insert(SeriesKey(s.name, s.labels)).second) return where + "duplicate series";
    e.samples.push_back(std::move(s));
  }
  if (std::string err = CheckHistograms(e); !err.empty()) return err;
  if (out != nullptr) *out = std::move(e);
  return {};
}

}  // namespace metronome::test_support
