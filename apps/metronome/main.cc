#include "metronome/cli/cli.h"

int main(int argc, char** argv) { return metronome::cli::Main(argc, argv); }
