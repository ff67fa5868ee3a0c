// Workload generators shared by `metronome sim`, `drive` and `loadgen`: when sessions arrive and
// how long they live, parsed from these spellings (PopulationOptions' arrival and session_duration)
//   --arrival poisson:RATE            sessions per second, Poisson process
//   --arrival ramp:R0,R1,SECONDS      Poisson with rate rising linearly from R0 to R1 over SECONDS,
//                                     then staying at R1
//   --session-duration fixed:S | exp:MEAN | lognormal:MU,SIGMA   (seconds; lognormal of ln-seconds)
// All draws come from a caller-owned seeded generator, so runs are reproducible.
//
// Thread-safety: immutable after parsing; sampling mutates only the caller's generator.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "metronome/realtime/session_resolve.h"

namespace metronome::realtime {

// Who asks for sessions and for how long: the part of a workload the engine-side runner
// (WorkloadRunner) and the client-side load generator share.
struct PopulationOptions {
  // A fixed population: N clients ask at t = 0 and retry after every rejection until admitted.
  std::int64_t sessions = 0;
  // Population sessions start with phases drawn uniformly from [0, period) (clients do not connect
  // in lockstep); true aligns them all to t = 0. Arriving sessions start when they are admitted.
  bool aligned_phases = false;
  std::string arrival;  // ArrivalProcess spec ("poisson:RATE", "ramp:..."), or empty
  // SessionDuration spec ("fixed:S", "exp:MEAN", "lognormal:MU,SIGMA"), or empty: sessions live
  // until the run ends.
  std::string session_duration;
  double duration_s = 60.0;  // run length on the clock, s
  std::uint64_t seed = 1;
  // An arriving client whose request is rejected retries after the retry-after hint for this long
  // (s, from its first request), then gives up (counted as abandoned). Population clients never
  // give up.
  double patience_s = 10.0;

  // ConfigError naming the field and value: sessions in [0, 1000000], at least one of sessions
  // and arrival, duration_s in (0, 1e7], patience_s >= 0, the specs parse.
  void Validate() const;
};

class ArrivalProcess {
 public:
  // Throws ConfigError naming the field (arrival) and the bad value.
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
  // Throws ConfigError naming the field (session_duration) and the bad value.
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

// One class of a mixed population: a name, the shape its sessions ask for (unset fields take the
// workload's defaults) and its weight among the classes' arrivals.
struct SessionClass {
  std::string name;
  SessionShape shape;
  double share = 1.0;  // relative weight, > 0; a class's share of arrivals is share / sum
};

// A mix of session classes, the one spelling sim, drive and loadgen take (PopulationOptions' mix):
//   NAME:KEY=VALUE,KEY=VALUE;NAME:...
// NAME: [a-z0-9_-]+, unique. KEYs (each at most once, any order; unset ones take the defaults):
//   period_ms=P  deadline_ms=D  in=A (tokens per frame)  out=O (output tokens per frame)
//   prompt=N (prompt tokens)  share=W (relative weight of its arrivals, default 1)
// e.g. "speech:period_ms=80,in=1,out=1,share=6;omni:period_ms=1000,in=25,out=1,prompt=2048,
// share=2;assistant:period_ms=2000,in=64,out=32,share=2". Only the syntax and each value's sign
// are checked here; the shape's domain is ResolveSession's. Throws ConfigError naming the field
// (mix), the class, the key and the value as spelled ("class 'omni': in=0 must be ...").
[[nodiscard]] std::vector<SessionClass> ParseSessionMix(const std::string& spec);

}  // namespace metronome::realtime
