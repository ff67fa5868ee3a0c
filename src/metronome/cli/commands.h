// The subcommands. Each command file defines how its flags are added and how it runs (one
// AddCommandFlags, made by AddFlagsAndRun); cli.cc's one table names and describes them in the
// order --help lists them and registers them in one loop. Internal to the cli module.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>

namespace metronome::cli {

// A chosen subcommand's run with its parsed flags bound in; returns the process exit code.
using CommandRun = std::function<int()>;

// Adds a command's flags to its subcommand `sub`; returns what runs it once they are parsed.
using AddCommandFlags = CommandRun (*)(CLI::App* sub);

// The AddCommandFlags of a command whose flags are a `Flags` (default-constructed: the defaults;
// its `void Register(CLI::App* sub)` adds them) and whose work is `Run`. The flags live as long as
// the returned run (CLI11 writes into them while parsing, Run reads them).
template <class Flags, int (*Run)(const Flags&)>
CommandRun AddFlagsAndRun(CLI::App* sub) {
  auto flags = std::make_shared<Flags>();
  flags->Register(sub);
  return [flags] { return Run(*flags); };
}

// One per command file (kAddServeFlags in serve.cc, ...); cli.cc names and describes them.
extern const AddCommandFlags kAddDemoFlags, kAddGenerateFlags, kAddScoreFlags, kAddBenchDecodeFlags,
    kAddExportGgufFlags, kAddInfoFlags, kAddTokenizeFlags, kAddQuantizeFlags, kAddCalibrateFlags,
    kAddSimFlags, kAddDriveFlags, kAddServeFlags, kAddLoadgenFlags, kAddSynthGgufFlags;

}  // namespace metronome::cli
