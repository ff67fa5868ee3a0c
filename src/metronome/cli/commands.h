// The subcommands. Each command file defines one Command (its name, its --help description, and
// how it adds its flags and runs) with MakeCommand; cli.cc registers the table of them, in the
// order --help lists them, in one loop. Internal to the cli module.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>

namespace metronome::cli {

// A chosen subcommand's run with its parsed flags bound in; returns the process exit code.
using CommandRun = std::function<int()>;

struct Command {
  const char* name;         // the subcommand, e.g. "serve"
  const char* description;  // its line in `metronome --help`
  // Adds the command's flags to its subcommand `sub`; returns what runs it once they are parsed.
  CommandRun (*add_flags)(CLI::App* sub);
};

// The Command of a subcommand whose flags are a `Flags` (default-constructed: the defaults; its
// `void Register(CLI::App* sub)` adds them) and whose work is `Run`. The flags live as long as the
// returned run (CLI11 writes into them while parsing, Run reads them).
template <class Flags, int (*Run)(const Flags&)>
constexpr Command MakeCommand(const char* name, const char* description) {
  return {name, description, [](CLI::App* sub) -> CommandRun {
            auto flags = std::make_shared<Flags>();
            flags->Register(sub);
            return [flags] { return Run(*flags); };
          }};
}

extern const Command kDemoCommand, kGenerateCommand, kScoreCommand, kBenchDecodeCommand,
    kExportGgufCommand, kInfoCommand, kTokenizeCommand, kQuantizeCommand, kCalibrateCommand,
    kSimCommand, kDriveCommand, kServeCommand, kLoadgenCommand;

}  // namespace metronome::cli
