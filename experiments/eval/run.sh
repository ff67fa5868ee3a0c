#!/usr/bin/env bash
# The evaluation suite (docs/results.md): every experiment, one after the other, with progress.
#   bash experiments/eval/run.sh [--quick] [--only 01,02] [--bin PATH] [--resume]
#                                [--publish | --publish-only]
# --quick: the CI-sized runs (a few minutes in all), into build/eval/quick.
# Full runs go into build/eval/full; --publish then copies each table into docs/results.md
# (between its BEGIN/END markers) and each plot into docs/results/; --publish-only publishes what
# an earlier full run left in build/eval/full without running anything.
# --resume: each experiment keeps the runs it finds in the output folder and runs the missing ones.
# Without --bin it builds the release preset first.
set -euo pipefail
cd "$(dirname "$0")/../.."
quick=()
resume=()
only=""
bin=""
publish=0
while (($# > 0)); do
  case "$1" in
    --quick) quick=(--quick); shift ;;
    --only) only="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --resume) resume=(--resume); shift ;;
    --publish) publish=1; shift ;;
    --publish-only) publish=2; shift ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [ -z "$bin" ] && [ "$publish" != 2 ]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target metronome realtime_benchmark
  bin=build/release/apps/metronome
fi
if ((${#quick[@]})); then out=build/eval/quick; else out=build/eval/full; fi
command -v gnuplot >/dev/null || { echo "run.sh: gnuplot missing (scripts/setup.sh)" >&2; exit 2; }

ran=0
for script in experiments/eval/[0-9][0-9]_*.sh; do
  name="$(basename "$script" .sh)"
  if [ -n "$only" ] && ! grep -qw "${name%%_*}" <<<"${only//,/ }"; then continue; fi
  ran=$((ran + 1))
  if [ "$publish" != 2 ]; then
    echo "== $name"
    bash "$script" "${quick[@]}" "${resume[@]}" --bin "$bin" --out "$out"
  fi
  if [ "$publish" != 0 ]; then
    for f in "$out/$name.md" "$out/$name.png"; do
      if [ ! -s "$f" ]; then echo "run.sh: nothing to publish: $f is missing" >&2; exit 1; fi
    done
    echo "== $name: published"
    mkdir -p docs/results
    cp "$out/$name.png" "docs/results/$name.png"
    # The table replaces what stands between this experiment's markers in docs/results.md.
    awk -v name="$name" -v table="$out/$name.md" '
      $0 == "<!-- BEGIN " name " -->" { print; while ((getline line < table) > 0) print line; skip = 1; next }
      $0 == "<!-- END " name " -->" { skip = 0 }
      !skip { print }' docs/results.md >docs/results.md.tmp
    mv docs/results.md.tmp docs/results.md
  fi
done
if ((ran == 0)); then
  echo "run.sh: no experiment matched --only '$only'" >&2
  exit 2
fi
if [ "$publish" = 2 ]; then
  echo "evaluation: $ran experiments published from $out"
else
  echo "evaluation: $ran experiments done; tables and plots in $out"
fi
