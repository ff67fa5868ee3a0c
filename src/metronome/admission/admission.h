// Admission: pluggable controllers that decide whether a new real-time session may join the engine.
// They are pure control laws (numbers in, decisions and limits out): no clock reads, no engine or
// pool dependency; the caller passes time as `now_s` and the pool state as a SystemState. Admission
// is irreversible for a session's lifetime, so no controller ever evicts an admitted session: a
// limit below the active count only blocks new sessions.
// Thread-safety: a controller is not thread-safe; one thread (the engine's) owns and calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace metronome::admission {

// What a new session asks for.
struct SessionRequest {
  double period_ms = 80.0;    // frame period; > 0
  double deadline_ms = 80.0;  // per-frame deadline D, measured from frame arrival; > 0
  // KV blocks the session will hold at most: its window bound (KvPolicy::MaxResidentBlocks) in
  // window mode, or a projection at MemoryOptions::full_mode_session_s in full mode
  // (ProjectFullModeBlocks). >= 0.
  std::int64_t projected_blocks = 0;
};

// The engine's view of itself when a decision is made. Includes every session admitted by earlier
// Decide calls, even if it has not run a frame yet.
struct SystemState {
  std::int64_t active_sessions = 0;
  std::int64_t free_blocks = 0;
  std::int64_t total_blocks = 0;
  // Blocks promised but not yet used: sum over admitted sessions of
  // max(0, projected_blocks - blocks held now).
  std::int64_t reserved_blocks = 0;
};

struct Decision {
  bool admit = false;
  // Empty when admitted; otherwise a short code ("limit", "kv_guard", "pool") a client can switch
  // on.
  std::string reason{};
  std::string detail{};         // human-readable, with the numbers behind the rejection
  double retry_after_ms = 0.0;  // hint for the client; 0 when admitted
};

// One change of a controller's session limit.
struct LimitChange {
  double t_s = 0.0;  // the caller's time of the window close that made the change
  std::int64_t from = 0;
  std::int64_t to = 0;
  std::string reason{};  // e.g. "increase: p99/D=0.52 < 0.65, binding (peak active 30, limit 31)"
};

// limit() of controllers that do not cap the session count (memory).
inline constexpr std::int64_t kNoLimit = -1;

// Options of the memory controller and of the AIMD controller's KV look-ahead guard.
struct MemoryOptions {
  // Assumed session length for the full-mode projection (ProjectFullModeBlocks), seconds. Longer is
  // safer against the pool running dry mid-session but admits fewer sessions. Default 300 s.
  double full_mode_session_s = 300.0;
  // Fraction of the pool never promised to sessions, in [0, 1): slack for projection error.
  // Default 0 (the projection is trusted).
  double headroom_fraction = 0.0;
};

// How the AIMD controller limits itself to one cut per congestion episode.
enum class CooldownMode : std::uint8_t {
  // After a cut, hold until one full control window has run with active <= limit throughout (the
  // first window that measures the load the cut allows), then act on that window. A cut cannot
  // take effect before admitted sessions end, so a fixed timer either waits too long or lets the
  // limit collapse while latency is still high from sessions admitted before the cut.
  kDrain,
  // After a cut, hold for AimdOptions::cooldown_s.
  kFixed,
};

struct AimdOptions {
  double window_s = 2.0;      // control window over which frame latencies are collected, s
  double percentile = 99.0;   // signal = this percentile of latency/deadline, in (0, 100]
  double low_target = 0.65;   // grow only while the signal is below low_target * D
  double high_target = 0.85;  // cut when the signal exceeds high_target * D; > low_target
  // Cut when the window's deadline-miss ratio exceeds this, in [0, 1). Default 0.1%.
  double miss_ratio_threshold = 0.001;
  std::int64_t increase_step = 1;  // sessions added per window when growing; >= 1
  double beta = 0.9;               // cut to floor(beta * active); in (0, 1)
  CooldownMode cooldown_mode = CooldownMode::kDrain;
  double cooldown_s = 4.0;         // only for kFixed; >= 0
  std::int64_t initial_limit = 4;  // warm start: e.g. the limit of a previous run
  std::int64_t min_limit = 1;      // >= 0
  std::int64_t max_limit = 1024;   // >= min_limit
  std::int64_t min_samples = 20;   // windows with fewer frames hold; >= 1
  // Frame latencies kept per window (reservoir sampling beyond it, so the percentile is exact up to
  // this many frames and an unbiased estimate above). 8 bytes each, allocated once.
  std::int64_t max_samples = 4096;
  // KV look-ahead guard: also require active < N_mem (SessionsThatFit), so a latency signal that
  // stays flat until the pool runs dry cannot over-admit. Uses MemoryOptions.
  bool kv_guard = false;
};

class AdmissionController {
 public:
  virtual ~AdmissionController() = default;

  // Whether the session described by `request` may join now. Never evicts anyone.
  virtual Decision Decide(const SessionRequest& request, const SystemState& state,
                          double now_s) = 0;
  // One emitted frame of an admitted session: latency from the frame's arrival to its output, and
  // whether it missed its deadline. Cheap: no allocation.
  virtual void OnFrame(double /*now_s*/, double /*latency_ms*/, double /*deadline_ms*/,
                       bool /*missed*/) noexcept {}
  // Called once per engine tick; controllers with control windows close them here (and in Decide).
  virtual void OnTick(double /*now_s*/, const SystemState& /*state*/) {}

  // Current session-count limit, or kNoLimit.
  [[nodiscard]] virtual std::int64_t limit() const = 0;
  // Whether admission promises KV: it admits a session only when the pool, less what earlier
  // sessions were promised, covers its request.projected_blocks (memory; aimd with kv_guard). Then
  // the promise is a per-session budget the caller may hold sessions to.
  [[nodiscard]] virtual bool reserves_kv() const { return false; }
  // Limit changes since the previous call, oldest first.
  virtual std::vector<LimitChange> TakeLimitChanges() { return {}; }
  // The controller and every parameter, e.g. "static(limit=8)".
  [[nodiscard]] virtual std::string Describe() const = 0;
};

// Sessions the pool can hold if each new one needs `request.projected_blocks`:
// active + floor(available / projected), available = free - reserved - ceil(headroom * total)
// (not below 0). Returns INT64_MAX when projected_blocks == 0.
[[nodiscard]] std::int64_t SessionsThatFit(const SessionRequest& request, const SystemState& state,
                                           const MemoryOptions& options);

// Blocks a full-mode session holds after `options.full_mode_session_s` of frames:
// ceil((prompt_tokens + frames * tokens_per_frame) / block_tokens), frames = session_s / period.
[[nodiscard]] std::int64_t ProjectFullModeBlocks(const MemoryOptions& options, double period_ms,
                                                 std::int64_t tokens_per_frame,
                                                 std::int64_t prompt_tokens,
                                                 std::int64_t block_tokens);

// Throw ConfigError naming the field and the bad value ("admission: aimd.beta must be in (0, 1),
// got 1.5").
void Validate(const AimdOptions& options);
void Validate(const MemoryOptions& options);

// Builds a controller from a spec: "static:N" (N >= 0), "memory" or "aimd". Validates the options
// the controller uses. Throws ConfigError naming the bad spec or value.
[[nodiscard]] std::unique_ptr<AdmissionController> MakeController(const std::string& spec,
                                                                  const AimdOptions& aimd,
                                                                  const MemoryOptions& memory);

}  // namespace metronome::admission
