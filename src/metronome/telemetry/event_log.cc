#include "metronome/telemetry/event_log.h"

#include <cerrno>
#include <utility>

#include "metronome/base/errors.h"

namespace metronome::telemetry {

EventLog::EventLog(const std::string& path, const EventLogOptions& options) : options_(options) {
  const auto mode = std::ios::out | (options.append ? std::ios::app : std::ios::trunc);
  errno = 0;
  file_ = std::make_unique<std::ofstream>(path, mode);
  if (!file_->is_open()) {
    throw ConfigError("cannot open event log '" + path + "': " + ErrnoMessage(errno));
  }
  out_ = file_.get();
}

EventLog::EventLog(std::ostream& out, const EventLogOptions& options)
    : out_(&out), options_(options) {}

EventLog::~EventLog() { Flush(); }

void EventLog::Write(double t_ms, std::string_view type, nlohmann::json fields) {
  if (!enabled()) return;
  nlohmann::json line = std::move(fields);
  if (line.is_null()) {
    line = nlohmann::json::object();
  } else if (!line.is_object()) {
    line = nlohmann::json{{"value", std::move(line)}};
  }
  line["t_ms"] = t_ms;
  line["type"] = type;
  // nlohmann writes NaN and +-Inf as null; `replace` turns invalid UTF-8 into U+FFFD instead of
  // throwing, so a line is always valid JSON.
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  const base::MutexLock lock(&mu_);
  out_->write(text.data(), static_cast<std::streamsize>(text.size()));
  if (options_.flush_every_line) out_->flush();
}

void EventLog::Frame(double t_ms, const FrameEvent& event) {
  if (!enabled()) return;
  Write(t_ms, "frame",
        {{"session", event.session_id},
         {"frame", event.frame},
         {"outcome", event.outcome},
         {"latency_ms", event.latency_ms},
         {"tokens", event.num_tokens}});
}

void EventLog::Admission(double t_ms, const AdmissionEvent& event) {
  if (!enabled()) return;
  Write(t_ms, "admission",
        {{"session", event.session_id},
         {"admitted", event.admitted},
         {"reason", event.reason},
         {"active", event.num_active},
         {"limit", event.limit}});
}

void EventLog::LimitChange(double t_ms, const LimitChangeEvent& event) {
  if (!enabled()) return;
  Write(t_ms, "limit_change",
        {{"old_limit", event.old_limit}, {"new_limit", event.new_limit}, {"reason", event.reason}});
}

void EventLog::Alarm(double t_ms, const AlarmEvent& event) {
  if (!enabled()) return;
  Write(t_ms, "alarm",
        {{"kind", event.kind}, {"session", event.session_id}, {"detail", event.detail}});
}

void EventLog::Flush() {
  if (!enabled()) return;
  const base::MutexLock lock(&mu_);
  out_->flush();
}

bool EventLog::ok() const {
  if (!enabled()) return true;
  const base::MutexLock lock(&mu_);
  return out_->good();
}

}  // namespace metronome::telemetry
