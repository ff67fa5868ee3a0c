#!/usr/bin/env bash
# The main job: set up, build (release) and run the multi-session demo on the built-in synthetic
# model. Extra arguments go to `metronome demo` (see `metronome demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target metronome
exec build/release/apps/metronome demo "$@"
