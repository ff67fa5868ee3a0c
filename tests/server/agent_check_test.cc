// The HAProxy agent's line for each replica state (agent_check.h's mapping).
#include "metronome/server/agent_check.h"

#include <gtest/gtest.h>

#include <string_view>

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
      // Free WebSocket slots bind when fewer than the headroom: capacity active + free.
      {{.draining = false, .limit = 8, .active = 3, .sessions = 3, .free_connection_slots = 10},
       "up ready 63% maxconn:8\n",
       "slots to spare: the limit binds"},
      {{.draining = false, .limit = 8, .active = 3, .sessions = 3, .free_connection_slots = 1},
       "up ready 25% maxconn:4\n",
       "1 slot left: capacity 4, room 1"},
      {{.draining = false,
        .limit = 333,
        .active = 256,
        .sessions = 256,
        .free_connection_slots = 0},
       "up drain maxconn:256\n",
       "every slot held (idle squatters): drain"},
      {{.draining = false, .limit = -1, .active = 5, .sessions = 5, .free_connection_slots = 5},
       "up ready 50% maxconn:10\n",
       "no count: the slots alone"},
      {{.draining = false, .limit = -1, .active = 0, .sessions = 0, .free_connection_slots = 0},
       "up drain\n",
       "no count, no slot: capacity 0 is no maxconn"},
      {{.draining = true, .limit = 8, .active = 2, .sessions = 2, .free_connection_slots = 4},
       "up drain maxconn:6\n",
       "shutting down, slots bind"},
      {{.draining = false, .limit = 5, .active = 2, .sessions = 4, .max_sessions = 5},
       "up ready 20% maxconn:5\n",
       "four light sessions under --max-sessions 5: the cap on sessions binds"},
      // Work units: heavy sessions take more of the budget than their count, light ones less.
      {{.draining = false, .limit = 8, .active = 6, .sessions = 2},
       "up ready 50% maxconn:4\n",
       "two sessions of 3 units: they and 2 reference sessions more"},
      {{.draining = false, .limit = 8, .active = 2, .sessions = 7},
       "up ready 47% maxconn:13\n",
       "seven light sessions in 2 units: 6 reference sessions more"},
      {{.draining = false, .limit = 8, .active = 2, .sessions = 7, .free_connection_slots = 1},
       "up ready 13% maxconn:8\n",
       "the same with one slot left: the slots bind"},
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

TEST(AgentCheckTest, CapacityAndRoomTakeTheSmallerOfLimitAndSlots) {
  struct Case {
    ReplicaState state;
    std::int64_t capacity;
    std::int64_t room;
    const char* why;
  };
  const Case cases[] = {
      {{.limit = 8, .active = 3, .sessions = 3}, 8, 5, "slots unknown: the limit"},
      {{.limit = 8, .active = 3, .sessions = 3, .free_connection_slots = 2}, 5, 2, "slots bind"},
      {{.limit = 4, .active = 6, .sessions = 6, .free_connection_slots = 9},
       6,
       0,
       "limit below active: the 6 held"},
      {{.limit = -1, .active = 6, .sessions = 6, .free_connection_slots = 9},
       15,
       9,
       "no limit: slots"},
      {{.limit = -1, .active = 6, .sessions = 6}, -1, -1, "neither known"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.state.capacity(), c.capacity) << c.why;
    EXPECT_EQ(c.state.room(), c.room) << c.why;
  }
}

// /readyz: 503 while draining or with no room, naming the first reason that applies.
TEST(AgentCheckTest, ReadinessNamesWhyNotReady) {
  struct Case {
    ReplicaState state;
    bool ready;
    std::string_view reason;
  };
  const Case cases[] = {
      {{.limit = 8, .active = 3, .sessions = 3, .free_connection_slots = 4}, true, "ok"},
      {{.limit = -1, .active = 3, .sessions = 3}, true, "ok"},
      {{.draining = true, .limit = 8, .active = 0, .sessions = 0}, false, "draining"},
      {{.draining = true, .limit = 8, .active = 8, .sessions = 8}, false, "draining"},
      {{.limit = 8, .active = 8, .sessions = 8, .free_connection_slots = 4},
       false,
       "admission_full"},
      {{.limit = 0, .active = 0, .sessions = 0}, false, "admission_full"},
      {{.limit = 8, .active = 3, .sessions = 3, .free_connection_slots = 0},
       false,
       "no_free_connection_slots"},
      {{.limit = -1, .active = 3, .sessions = 3, .free_connection_slots = 0},
       false,
       "no_free_connection_slots"},
  };
  for (const Case& c : cases) {
    const Readiness r = ReadinessOf(c.state);
    EXPECT_EQ(r.ready, c.ready) << c.reason;
    EXPECT_EQ(std::string_view(r.reason), c.reason);
  }
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
