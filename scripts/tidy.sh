#!/usr/bin/env bash
# clang-tidy (checks in .clang-tidy, warnings as errors) over the project's sources, using the
# compile database of a configured build. Usage: scripts/tidy.sh [build dir] [files...]
# Without files it checks every .cc under src/ and apps/.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/ci}"
shift || true
if [ ! -f "$build/compile_commands.json" ]; then
  echo "tidy: $build/compile_commands.json missing; configure first (cmake --preset ci)" >&2
  exit 2
fi
if (($# == 0)); then
  mapfile -t files < <(git ls-files 'src/*.cc' 'apps/*.cc')
else
  files=("$@")
fi
log="$(mktemp)"
status=0
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy -p "$build" --quiet >"$log" 2>&1 ||
  status=$?
grep -v -E "warnings? generated|Suppressed|Use -header-filter" "$log" || true
rm -f "$log"
if ((status != 0)); then
  echo "tidy: clang-tidy reported problems" >&2
  exit 1
fi
echo "tidy: ${#files[@]} files clean"
