// Cold-path errors: bad model files, bad configuration and bad command-line values. They carry a
// message that names the file or field and the offending value, and are caught only at a tool's
// main() or an API edge. Hot paths never throw (they return result enums).
#pragma once

#include <stdexcept>
#include <string>

namespace metronome {

// A model or tokenizer file that cannot be used: wrong format, truncated, hostile.
class LoadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A number as error messages show it: printf's %g (6 significant digits, no trailing zeros).
std::string FormatValue(double v);

// strerror(err) without strerror's shared static buffer (safe from any thread).
std::string ErrnoMessage(int err);

// A configuration value outside its domain (flag, option struct field, protocol parameter).
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace metronome
