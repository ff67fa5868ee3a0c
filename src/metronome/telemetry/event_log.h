// JSON-lines event log for experiments: one JSON object per line, each with "t_ms" (the caller's
// clock, ms) and "type" ("frame", "admission", "limit_change", "alarm", or a caller's own) plus
// that event's fields. Non-finite numbers are written as null and invalid UTF-8 is replaced, so
// every line parses. A default-constructed log is disabled and every call returns at once.
// Thread-safety: all methods may be called from any thread; lines are serialised outside the lock
// and written whole under it, so concurrent writers never interleave within a line.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>

#include "metronome/base/thread_annotations.h"

namespace metronome::telemetry {

struct EventLogOptions {
  // Flush the stream after every line: nothing is lost if the process dies, at the cost of one
  // write() per event. Default false (flushed by Flush() and on destruction).
  bool flush_every_line = false;
  // For a file path: append to an existing file instead of truncating it.
  bool append = false;
};

// One session's frame (type "frame").
struct FrameEvent {
  std::uint64_t session_id = 0;
  std::int64_t frame = 0;         // frame index within the session
  std::string_view outcome = {};  // "ok", "late", "starved", "short" (see FrameOutcome)
  double latency_ms = 0.0;        // tick to output
  int num_tokens = 0;             // tokens generated in this frame
};

// An admission decision (type "admission").
struct AdmissionEvent {
  std::uint64_t session_id = 0;
  bool admitted = false;
  std::string_view reason =
      {};              // why it was refused ("limit", "kv_pool", ...); empty when admitted
  int num_active = 0;  // sessions running after the decision
  int limit = 0;       // admission limit at the time (sessions)
};

// The admission controller moved its limit (type "limit_change").
struct LimitChangeEvent {
  int old_limit = 0;  // sessions
  int new_limit = 0;  // sessions
  std::string_view reason = {};
};

// An alarm (type "alarm"), e.g. kind "mute" when a session produced no output.
struct AlarmEvent {
  std::string_view kind = {};
  std::uint64_t session_id = 0;
  std::string_view detail = {};
};

class EventLog {
 public:
  // Disabled: enabled() is false and nothing is written.
  EventLog() = default;
  // Writes to `path` (created or truncated, see options). Throws ConfigError naming the path if it
  // cannot be opened.
  explicit EventLog(const std::string& path, const EventLogOptions& options = {});
  // Writes to `out`, which is not owned and must outlive the log.
  explicit EventLog(std::ostream& out, const EventLogOptions& options = {});
  // Flushes.
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  [[nodiscard]] bool enabled() const noexcept { return out_ != nullptr; }

  // Writes {"t_ms": t_ms, "type": type, ...fields}. `fields` must be an object or null (anything
  // else is stored under "value"); its own "t_ms"/"type" keys are overwritten. Callers that build
  // `fields` on a hot path should test enabled() first.
  void Write(double t_ms, std::string_view type, nlohmann::json fields = nullptr);

  void Frame(double t_ms, const FrameEvent& event);
  void Admission(double t_ms, const AdmissionEvent& event);
  void LimitChange(double t_ms, const LimitChangeEvent& event);
  void Alarm(double t_ms, const AlarmEvent& event);

  void Flush();
  // False once a write to the underlying stream has failed (e.g. disk full); lines are then lost.
  [[nodiscard]] bool ok() const;

 private:
  std::unique_ptr<std::ofstream> file_;  // set when the log owns its file
  mutable base::Mutex mu_;
  std::ostream* out_ PT_GUARDED_BY(mu_) = nullptr;  // null: disabled
  EventLogOptions options_;
};

}  // namespace metronome::telemetry
