#include "metronome/telemetry/event_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "metronome/base/errors.h"

namespace metronome::telemetry {
namespace {

// Parses every line (each must be a JSON object with a numeric-or-null t_ms and a string type).
std::vector<nlohmann::json> ParseLines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j;
    EXPECT_NO_THROW(j = nlohmann::json::parse(line)) << line;
    EXPECT_TRUE(j.is_object()) << line;
    EXPECT_TRUE(j.contains("t_ms") && (j["t_ms"].is_number() || j["t_ms"].is_null())) << line;
    EXPECT_TRUE(j.contains("type") && j["type"].is_string()) << line;
    lines.push_back(std::move(j));
  }
  EXPECT_TRUE(text.empty() || text.back() == '\n');
  return lines;
}

TEST(EventLogTest, WritesOneJsonObjectPerLine) {
  std::ostringstream out;
  {
    EventLog log(out);
    ASSERT_TRUE(log.enabled());
    log.Frame(
        1.5,
        {.session_id = 7, .frame = 3, .outcome = "late", .latency_ms = 81.25, .num_tokens = 2});
    log.Admission(
        2.0, {.session_id = 8, .admitted = false, .reason = "limit", .num_active = 4, .limit = 4});
    log.LimitChange(3.0, {.old_limit = 4, .new_limit = 5, .reason = "headroom"});
    log.Alarm(4.0, {.kind = "mute", .session_id = 7, .detail = "no output for 3 frames"});
    log.Write(5.0, "custom", {{"x", 1}, {"type", "ignored"}});
    log.Write(6.0, "bare");
    log.Write(7.0, "scalar", 42);
    EXPECT_TRUE(log.ok());
  }
  const std::vector<nlohmann::json> lines = ParseLines(out.str());
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[0]["type"], "frame");
  EXPECT_EQ(lines[0]["t_ms"], 1.5);
  EXPECT_EQ(lines[0]["session"], 7);
  EXPECT_EQ(lines[0]["outcome"], "late");
  EXPECT_EQ(lines[0]["latency_ms"], 81.25);
  EXPECT_EQ(lines[0]["tokens"], 2);
  EXPECT_EQ(lines[1]["type"], "admission");
  EXPECT_EQ(lines[1]["admitted"], false);
  EXPECT_EQ(lines[1]["reason"], "limit");
  EXPECT_EQ(lines[2]["type"], "limit_change");
  EXPECT_EQ(lines[2]["new_limit"], 5);
  EXPECT_EQ(lines[3]["type"], "alarm");
  EXPECT_EQ(lines[3]["kind"], "mute");
  EXPECT_EQ(lines[4]["type"], "custom");
  EXPECT_EQ(lines[4]["x"], 1);
  EXPECT_EQ(lines[5].size(), 2u);
  EXPECT_EQ(lines[6]["value"], 42);
}

TEST(EventLogTest, NonFiniteNumbersBecomeNullAndBadUtf8IsReplaced) {
  std::ostringstream out;
  EventLog log(out);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  log.Write(nan, "frame", {{"latency_ms", inf}, {"neg", -inf}, {"nested", {{"v", nan}}}});
  log.Frame(inf, {.session_id = 1, .outcome = "ok", .latency_ms = nan});
  log.Alarm(1.0, {.kind = "mute", .detail = "bad \xff\xfe utf-8"});
  log.Flush();
  const std::vector<nlohmann::json> lines = ParseLines(out.str());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_TRUE(lines[0]["t_ms"].is_null());
  EXPECT_TRUE(lines[0]["latency_ms"].is_null());
  EXPECT_TRUE(lines[0]["neg"].is_null());
  EXPECT_TRUE(lines[0]["nested"]["v"].is_null());
  EXPECT_TRUE(lines[1]["t_ms"].is_null());
  EXPECT_TRUE(lines[1]["latency_ms"].is_null());
  EXPECT_TRUE(lines[2]["detail"].is_string());
}

TEST(EventLogTest, ConcurrentWritersNeverInterleaveLines) {
  std::ostringstream out;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  {
    EventLog log(out);
    std::vector<std::thread> threads;
    threads.reserve(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&log, t] {
        // Long lines make a torn write likely if the lock were missing.
        const std::string padding(200, static_cast<char>('a' + t));
        for (int i = 0; i < kPerThread; ++i) {
          log.Write(i, "frame", {{"thread", t}, {"i", i}, {"pad", padding}});
        }
      });
    }
    for (std::thread& th : threads) th.join();
  }
  const std::vector<nlohmann::json> lines = ParseLines(out.str());
  ASSERT_EQ(lines.size(), static_cast<std::size_t>(kThreads * kPerThread));
  std::set<std::pair<int, int>> seen;
  for (const nlohmann::json& j : lines) {
    const int t = j["thread"];
    EXPECT_EQ(j["pad"], std::string(200, static_cast<char>('a' + t)));
    EXPECT_TRUE(seen.emplace(t, j["i"].get<int>()).second);
  }
}

TEST(EventLogTest, DisabledLogWritesNothing) {
  EventLog log;
  EXPECT_FALSE(log.enabled());
  log.Frame(1.0, {.session_id = 1});
  log.Write(1.0, "x", {{"a", 1}});
  log.Flush();
  EXPECT_TRUE(log.ok());
}

TEST(EventLogTest, FileLogIsFlushedOnDestructionAndCanAppend) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) /
                            ("metronome_events_" + std::to_string(::getpid()) + ".jsonl"))
                               .string();
  const auto read = [&] {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  {
    EventLog log(path);
    log.LimitChange(10.0, {.old_limit = 1, .new_limit = 2, .reason = "probe"});
  }
  EXPECT_EQ(ParseLines(read()).size(), 1u);
  {
    EventLog log(path, {.flush_every_line = true, .append = true});
    log.LimitChange(20.0, {.old_limit = 2, .new_limit = 3, .reason = "probe"});
    EXPECT_EQ(ParseLines(read()).size(), 2u);  // already on disk before destruction
  }
  {
    EventLog log(path);  // truncates
  }
  EXPECT_EQ(read(), "");
  std::filesystem::remove(path);
  EXPECT_THROW(EventLog("/nonexistent-dir/x/events.jsonl"), ConfigError);
}

}  // namespace
}  // namespace metronome::telemetry
