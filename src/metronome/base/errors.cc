#include "metronome/base/errors.h"

#include <cstdio>
#include <cstring>

namespace metronome {

std::string FormatValue(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string ErrnoMessage(int err) {
  char buf[256];
  // GNU strerror_r returns a pointer to the message (in buf or a static string).
  const char* msg = strerror_r(err, buf, sizeof buf);
  return msg;
}

}  // namespace metronome
