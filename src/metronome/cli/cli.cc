#include "metronome/cli/cli.h"

#include <CLI/CLI.hpp>
#include <array>
#include <cstdio>
#include <exception>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"

namespace metronome::cli {
namespace {

// In the order `metronome --help` lists them.
constexpr std::array kCommands = {
    &kDemoCommand,  &kGenerateCommand, &kScoreCommand,    &kBenchDecodeCommand, &kExportGgufCommand,
    &kInfoCommand,  &kTokenizeCommand, &kQuantizeCommand, &kCalibrateCommand,   &kSimCommand,
    &kDriveCommand, &kServeCommand,    &kLoadgenCommand};

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"metronome: a serving engine for real-time interaction models"};
  app.require_subcommand(1);
  int exit_code = 0;
  for (const Command* command : kCommands) {
    CLI::App* sub = app.add_subcommand(command->name, command->description);
    sub->callback([run = command->add_flags(sub), &exit_code] { exit_code = run(); });
  }
  RequireFiniteNumbers(&app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and friends are ParseErrors with exit code 0. Every real one (unknown flag, a value
    // CLI11 cannot convert or a validator refuses) is a bad flag like a ConfigError: one line, 2.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const LoadError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 2;
  }
  return exit_code;
}

}  // namespace metronome::cli
