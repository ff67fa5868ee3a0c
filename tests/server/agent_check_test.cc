// The HAProxy agent's line for each replica state (agent_check.h's mapping).
#include "metronome/server/agent_check.h"

#include <gtest/gtest.h>

namespace metronome::server {
namespace {

TEST(AgentCheckTest, LineForEachState) {
  struct Case {
    ReplicaState state;
    const char* line;
    const char* why;
  };
  const Case cases[] = {
      {{.draining = false, .limit = 8, .active = 0, .sessions = 0},
       "up ready 100% maxconn:8\n",
       "idle"},
      {{.draining = false, .limit = 8, .active = 3, .sessions = 3},
       "up ready 63% maxconn:8\n",
       "5/8 rounds up"},
      {{.draining = false, .limit = 8, .active = 7, .sessions = 7},
       "up ready 13% maxconn:8\n",
       "1/8"},
      {{.draining = false, .limit = 300, .active = 299, .sessions = 299},
       "up ready 1% maxconn:300\n",
       "> 0 is 1%"},
      {{.draining = false, .limit = 8, .active = 8, .sessions = 8},
       "up drain maxconn:8\n",
       "full: drain"},
      {{.draining = false, .limit = 4, .active = 6, .sessions = 6},
       "up drain maxconn:6\n",
       "limit cut below: the 6 held"},
      {{.draining = true, .limit = 8, .active = 2, .sessions = 2},
       "up drain maxconn:8\n",
       "shutting down"},
      {{.draining = false, .limit = -1, .active = 5, .sessions = 5},
       "up ready 100%\n",
       "no count: no maxconn"},
      {{.draining = true, .limit = -1, .active = 5, .sessions = 5},
       "up drain\n",
       "no count, shutting down"},
      {{.draining = false, .limit = 0, .active = 0, .sessions = 0},
       "up drain\n",
       "static:0: maxconn 0 is none"},
      {{.draining = false, .limit = 8, .active = 6, .sessions = 2},
       "up ready 25% maxconn:4\n",
       "two sessions of 3 units: HAProxy may hold them and 2 reference sessions more"},
      {{.draining = false, .limit = 8, .active = 2, .sessions = 7},
       "up ready 75% maxconn:13\n",
       "seven light sessions in 2 units: 6 reference sessions more"},
  };
  for (const Case& c : cases) EXPECT_EQ(AgentResponse(c.state), c.line) << c.why;
}

TEST(AgentCheckTest, HeadroomIsLimitLessActiveNeverNegative) {
  EXPECT_EQ((ReplicaState{.draining = false, .limit = 8, .active = 3, .sessions = 3}).headroom(),
            5);
  EXPECT_EQ((ReplicaState{.draining = false, .limit = 4, .active = 6, .sessions = 6}).headroom(),
            0);
  EXPECT_EQ((ReplicaState{.draining = false, .limit = -1, .active = 6, .sessions = 6}).headroom(),
            -1);
}

// Every line is one short ASCII line HAProxy can read: words from its vocabulary, one newline.
TEST(AgentCheckTest, EveryLineIsOneLineOfKnownWords) {
  for (int limit = -1; limit <= 40; ++limit) {
    for (int active = 0; active <= 45; ++active) {
      for (const bool draining : {false, true}) {
        const std::string line = AgentResponse(
            {.draining = draining, .limit = limit, .active = active, .sessions = active});
        ASSERT_FALSE(line.empty());
        ASSERT_EQ(line.back(), '\n');
        ASSERT_EQ(line.find('\n'), line.size() - 1);
        ASSERT_LT(line.size(), 64u);
        const bool drains = line.find(" drain") != std::string::npos;
        ASSERT_EQ(drains, draining || (limit >= 0 && active >= limit)) << line;
        ASSERT_EQ(line.find("maxconn:") != std::string::npos,
                  limit >= 0 && (limit > 0 || active > 0))
            << line;
      }
    }
  }
}

}  // namespace
}  // namespace metronome::server
