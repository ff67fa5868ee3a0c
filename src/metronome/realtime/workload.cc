#include "metronome/realtime/workload.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "metronome/base/errors.h"

namespace metronome::realtime {
namespace {

// "<field> = '<spec>': <what>", the shape of every error here.
ConfigError SpecError(const std::string& flag, const std::string& spec, const std::string& what) {
  std::string msg = flag;
  msg += " = '";
  msg += spec;
  msg += "': ";
  msg += what;
  return ConfigError(msg);
}

// The whole of `text` as a finite number, or nothing.
std::optional<double> ParseNumber(const std::string& text) {
  std::size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (text.empty() || used != text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// "a,b,c" -> numbers; ConfigError naming the flag and the whole value on any junk.
std::vector<double> ParseNumbers(const std::string& text, const std::string& flag,
                                 const std::string& spec) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const std::optional<double> v = ParseNumber(item);
    if (!v) throw SpecError(flag, spec, "'" + item + "' is not a number");
    out.push_back(*v);
  }
  return out;
}

// A spec "KIND:N1,N2,...", split into its kind and its numbers (the grammar of every spec here).
struct KindAndNumbers {
  std::string kind;
  std::vector<double> numbers;
};
KindAndNumbers ParseKindAndNumbers(const std::string& spec, const std::string& flag) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos) {
    throw SpecError(flag, spec, "expected KIND:VALUES");
  }
  return {spec.substr(0, colon), ParseNumbers(spec.substr(colon + 1), flag, spec)};
}

}  // namespace

ArrivalProcess ArrivalProcess::Parse(const std::string& spec) {
  const std::string flag = "arrival";
  const auto [kind, v] = ParseKindAndNumbers(spec, flag);
  ArrivalProcess p;
  p.spec_ = spec;
  if (kind == "poisson") {
    if (v.size() != 1 || !(v[0] > 0.0)) {
      throw SpecError(flag, spec, "poisson:RATE needs one rate > 0 (sessions/s)");
    }
    p.rate0_ = p.rate1_ = v[0];
  } else if (kind == "ramp") {
    if (v.size() != 3 || v[0] < 0.0 || v[1] < 0.0 || !(v[0] + v[1] > 0.0) || !(v[2] > 0.0)) {
      throw SpecError(flag, spec,
                      "ramp:R0,R1,SECONDS needs rates >= 0 (not both 0) and SECONDS > 0");
    }
    p.rate0_ = v[0];
    p.rate1_ = v[1];
    p.ramp_s_ = v[2];
  } else {
    throw SpecError(flag, spec,
                    "unknown kind '" + kind + "' (expected poisson:RATE or ramp:R0,R1,SECONDS)");
  }
  return p;
}

double ArrivalProcess::RateAt(double t_s) const {
  if (ramp_s_ <= 0.0 || t_s >= ramp_s_) return rate1_;
  if (t_s <= 0.0) return rate0_;
  return rate0_ + (rate1_ - rate0_) * t_s / ramp_s_;
}

double ArrivalProcess::ExpectedArrivals(double t_s) const {
  if (t_s <= 0.0) return 0.0;
  if (ramp_s_ <= 0.0) return rate1_ * t_s;
  const double in_ramp = std::min(t_s, ramp_s_);
  const double ramp_part = in_ramp * (rate0_ + RateAt(in_ramp)) / 2.0;
  return ramp_part + (t_s > ramp_s_ ? rate1_ * (t_s - ramp_s_) : 0.0);
}

double ArrivalProcess::NextAfter(double t_s, std::mt19937_64& rng) const {
  // Thinning (Lewis-Shedler): candidates at the maximum rate, each kept with rate(t)/max.
  const double max_rate = std::max(rate0_, rate1_);
  std::exponential_distribution<double> gap(max_rate);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double t = t_s;
  for (;;) {
    t += gap(rng);
    if (u(rng) * max_rate <= RateAt(t)) return t;
  }
}

SessionDuration SessionDuration::Parse(const std::string& spec) {
  const std::string flag = "session_duration";
  const auto [kind, v] = ParseKindAndNumbers(spec, flag);
  SessionDuration d;
  d.spec_ = spec;
  if (kind == "fixed" || kind == "exp") {
    if (v.size() != 1 || !(v[0] > 0.0)) {
      throw SpecError(flag, spec, kind + ":SECONDS needs one value > 0");
    }
    d.kind_ = kind == "fixed" ? Kind::kFixed : Kind::kExp;
    d.a_ = v[0];
  } else if (kind == "lognormal") {
    if (v.size() != 2 || !(v[1] >= 0.0) || v[0] > 30.0) {
      throw SpecError(flag, spec, "lognormal:MU,SIGMA needs MU <= 30 (ln seconds) and SIGMA >= 0");
    }
    d.kind_ = Kind::kLognormal;
    d.a_ = v[0];
    d.b_ = v[1];
  } else {
    throw SpecError(
        flag, spec,
        "unknown kind '" + kind + "' (expected fixed:S, exp:MEAN or lognormal:MU,SIGMA)");
  }
  return d;
}

double SessionDuration::Sample(std::mt19937_64& rng) const {
  // A session lives at least a microsecond: zero-length sessions would never see a frame.
  constexpr double kMin = 1e-6;
  switch (kind_) {
    case Kind::kFixed:
      return a_;
    case Kind::kExp:
      return std::max(kMin, std::exponential_distribution<double>(1.0 / a_)(rng));
    case Kind::kLognormal:
      return std::max(kMin, std::lognormal_distribution<double>(a_, b_)(rng));
  }
  return a_;
}

double SessionDuration::Mean() const {
  switch (kind_) {
    case Kind::kFixed:
    case Kind::kExp:
      return a_;
    case Kind::kLognormal:
      return std::exp(a_ + b_ * b_ / 2.0);
  }
  return a_;
}

void PopulationOptions::Validate() const {
  if (sessions < 0 || sessions > 1'000'000) {
    throw ConfigError("sessions = " + std::to_string(sessions) + " must be in [0, 1000000]");
  }
  if (sessions == 0 && arrival.empty()) {
    throw ConfigError(
        "sessions = 0 and arrival = '': give a fixed population or a process of "
        "arrivals");
  }
  if (!(duration_s > 0.0 && duration_s <= 1e7)) {
    throw ConfigError("duration_s = " + FormatValue(duration_s) + " must be in (0, 1e7] seconds");
  }
  if (!(patience_s >= 0.0 && std::isfinite(patience_s))) {
    throw ConfigError("patience_s = " + FormatValue(patience_s) + " must be >= 0");
  }
  if (!arrival.empty()) (void)ArrivalProcess::Parse(arrival);
  if (!session_duration.empty()) (void)SessionDuration::Parse(session_duration);
}

std::vector<SessionClass> ParseSessionMix(const std::string& spec) {
  const std::string flag = "mix";
  std::vector<SessionClass> classes;
  std::stringstream items(spec);
  std::string item;
  while (std::getline(items, item, ';')) {
    const auto colon = item.find(':');
    const std::string name = item.substr(0, colon);
    const bool name_ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    });
    if (colon == std::string::npos || !name_ok) {
      throw SpecError(flag, spec,
                      "class '" + item + "' must be NAME:KEY=VALUE,... with NAME of [a-z0-9_-]");
    }
    for (const SessionClass& c : classes) {
      if (c.name == name) throw SpecError(flag, spec, "class '" + name + "' is given twice");
    }
    SessionClass c;
    c.name = name;
    const std::string in_class = "class '" + name + "': ";
    std::stringstream fields(item.substr(colon + 1));
    std::string field;
    std::vector<std::string> seen;
    while (std::getline(fields, field, ',')) {
      const auto eq = field.find('=');
      const std::string key = field.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : field.substr(eq + 1);
      // "class 'NAME': <subject><what>", thrown as the mix's error.
      const auto bad = [&](const std::string& subject, const char* what) {
        std::string m = in_class;
        m += subject;
        m += what;
        return SpecError(flag, spec, m);
      };
      if (eq == std::string::npos || value.empty()) throw bad("'" + field, "' must be KEY=VALUE");
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) throw bad(key, " is given twice");
      seen.push_back(key);
      std::string as_given = key;  // as the spec spells it
      as_given += '=';
      as_given += value;
      const std::optional<double> parsed = ParseNumber(value);
      if (!parsed) throw bad(as_given, " is not a number");
      const double v = *parsed;
      const bool integral = v == std::floor(v) && std::fabs(v) <= (1 << 30);
      auto integer = [&](int lo) {  // lo: 0 or 1
        if (!integral || v < lo) {
          throw bad(as_given, lo == 0 ? " must be an integer >= 0" : " must be an integer >= 1");
        }
        return static_cast<int>(v);
      };
      auto positive = [&](bool zero_ok) {
        if (!(v > 0.0 || (zero_ok && v == 0.0)))
          throw bad(as_given, zero_ok ? " must be >= 0" : " must be > 0");
        return v;
      };
      if (key == "period_ms") {
        c.shape.period_ms = positive(false);
      } else if (key == "deadline_ms") {
        c.shape.deadline_ms = positive(true);
      } else if (key == "in") {
        c.shape.tokens_per_frame = integer(1);
      } else if (key == "out") {
        c.shape.output_tokens_per_frame = integer(0);
      } else if (key == "prompt") {
        const int tokens = integer(0);
        if (tokens > 0) c.shape.prompt = SyntheticPrompt{.tokens = tokens};
      } else if (key == "share") {
        c.share = positive(false);
      } else {
        throw bad("unknown key '" + key,
                  "' (expected period_ms, deadline_ms, in, out, prompt or share)");
      }
    }
    classes.push_back(std::move(c));
  }
  if (classes.empty()) throw SpecError(flag, spec, "no class given");
  return classes;
}

}  // namespace metronome::realtime
