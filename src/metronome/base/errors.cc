#include "metronome/base/errors.h"

#include <cstring>

namespace metronome {

std::string ErrnoMessage(int err) {
  char buf[256];
  // GNU strerror_r returns a pointer to the message (in buf or a static string).
  const char* msg = strerror_r(err, buf, sizeof buf);
  return msg;
}

}  // namespace metronome
