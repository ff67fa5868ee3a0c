// The `metronome` command line: one entry point, one file per subcommand. Subcommands print their
// results to stdout and diagnostics to stderr, and return a process exit code; bad flags, bad
// model files and bad values exit non-zero with a message naming the flag/file and value.
#pragma once

namespace metronome::cli {

int Main(int argc, char** argv);

}  // namespace metronome::cli
