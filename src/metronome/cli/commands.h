// Subcommand registration. Each Register* adds its subcommand to `app`; when the subcommand is
// chosen its callback runs the command and stores the exit code in *exit_code.
#pragma once

#include <CLI/CLI.hpp>

namespace metronome::cli {

void RegisterGenerate(CLI::App* app, int* exit_code);
void RegisterScore(CLI::App* app, int* exit_code);
void RegisterBenchDecode(CLI::App* app, int* exit_code);
void RegisterDemo(CLI::App* app, int* exit_code);
void RegisterExportGguf(CLI::App* app, int* exit_code);
void RegisterInfo(CLI::App* app, int* exit_code);
void RegisterTokenize(CLI::App* app, int* exit_code);
void RegisterQuantize(CLI::App* app, int* exit_code);
void RegisterCalibrate(CLI::App* app, int* exit_code);
void RegisterSim(CLI::App* app, int* exit_code);
void RegisterDrive(CLI::App* app, int* exit_code);
void RegisterServe(CLI::App* app, int* exit_code);
void RegisterLoadgen(CLI::App* app, int* exit_code);

}  // namespace metronome::cli
