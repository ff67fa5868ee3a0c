// Workload generators shared by `metronome sim`, `drive` and `loadgen`: when sessions arrive and
// how long they live, parsed from the command-line spellings
//   --arrival poisson:RATE            sessions per second, Poisson process
//   --arrival ramp:R0,R1,SECONDS      Poisson with rate rising linearly from R0 to R1 over SECONDS,
//                                     then staying at R1
//   --session-duration fixed:S | exp:MEAN | lognormal:MU,SIGMA   (seconds; lognormal of ln-seconds)
// All draws come from a caller-owned seeded generator, so runs are reproducible.
//
// Thread-safety: immutable after parsing; sampling mutates only the caller's generator.
#pragma once

#include <random>
#include <string>

namespace metronome::realtime {

class ArrivalProcess {
 public:
  // Throws ConfigError naming --arrival and the bad value.
  static ArrivalProcess Parse(const std::string& spec);

  // Time of the next arrival strictly after `t_s` (seconds).
  [[nodiscard]] double NextAfter(double t_s, std::mt19937_64& rng) const;
  // Expected arrivals in [0, t_s): the integral of the rate.
  [[nodiscard]] double ExpectedArrivals(double t_s) const;
  [[nodiscard]] double RateAt(double t_s) const;
  [[nodiscard]] const std::string& spec() const { return spec_; }

 private:
  std::string spec_;
  double rate0_ = 0.0;   // sessions/s at t = 0
  double rate1_ = 0.0;   // sessions/s from ramp_s on
  double ramp_s_ = 0.0;  // 0: constant rate
};

class SessionDuration {
 public:
  // Throws ConfigError naming --session-duration and the bad value.
  static SessionDuration Parse(const std::string& spec);

  [[nodiscard]] double Sample(std::mt19937_64& rng) const;  // seconds, > 0
  [[nodiscard]] double Mean() const;                        // seconds
  [[nodiscard]] const std::string& spec() const { return spec_; }

 private:
  enum class Kind { kFixed, kExp, kLognormal };
  std::string spec_;
  Kind kind_ = Kind::kFixed;
  double a_ = 0.0;  // fixed: S; exp: mean; lognormal: mu
  double b_ = 0.0;  // lognormal: sigma
};

}  // namespace metronome::realtime
