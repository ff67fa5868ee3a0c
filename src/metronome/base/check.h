// Invariant checks for bugs (never for bad user input, which gets an error value or a
// LoadError/ConfigError). MTR_CHECK is always on and aborts with file, line and message;
// MTR_DCHECK compiles away in release builds and is the one to use in inner loops.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace metronome::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* cond,
                                     const char* msg) {
  std::fprintf(stderr, "%s:%d: check failed: %s (%s)\n", file, line, cond, msg);
  std::abort();
}
}  // namespace metronome::internal

#define MTR_CHECK(cond, msg)                                                \
  do {                                                                      \
    if (!(cond)) [[unlikely]] {                                             \
      ::metronome::internal::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
    }                                                                       \
  } while (false)

#ifdef NDEBUG
#define MTR_DCHECK(cond, msg) \
  do {                        \
  } while (false)
#else
#define MTR_DCHECK(cond, msg) MTR_CHECK(cond, msg)
#endif
