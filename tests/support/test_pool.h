// The thread pool a test runs kernels on when it has no engine: one per test process, of
// base::DetectedCpuCount() threads (what an engine with num_threads = 0 owns).
#pragma once

#include "metronome/base/thread_pool.h"

namespace metronome::testing {

inline base::ThreadPool& TestPool() {
  static base::ThreadPool pool;
  return pool;
}

}  // namespace metronome::testing
