#!/usr/bin/env bash
# How decode throughput holds up with busy co-tenant processes on the machine: for 1 session and
# 32 sessions of synthetic:smol-135m (context 64) and 1 session of stories260K (context 64, a
# 64-token window so that a run of 4000 steps keeps that cost), `bench-decode
# --cotenant N` measures decode quiet and then with N spinning processes, in the same run, and
# prints the ratio. Run it on an otherwise quiet machine: other load changes both figures.
# Usage: experiments/cotenant.sh [metronome binary] [extra bench-decode flags, e.g. --threads 1]
set -euo pipefail
bin="${1:-build/release/apps/metronome}"
shift || true
shared="${METRONOME_SHARED_DIR:-$(dirname "$0")/../../shared}"
stories=(--model "$shared/models/stories260K.bin" --tokenizer "$shared/models/tok512.bin")

run() {  # run LABEL N FLAGS...: prints one markdown row
  local label="$1" n="$2"
  shift 2
  local out
  out="$("$bin" bench-decode "$@" --cotenant "$n")"
  awk -v label="$label" -v n="$n" '
    /^bench-decode/ { for (i = 1; i <= NF; i++) if ($i ~ /^threads=/) { split($i, t, "="); th = t[2] } }
    /^cotenant decode tokens\/s/ { printf "| %s | %s | %d | %s | %s | %s |\n", label, th, n, $6, $4, $8 }
  ' <<<"$out"
}

echo "| config | threads | busy processes | quiet tok/s | with busy tok/s | ratio |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for n in 1 2; do
  run "smol-135m, 1 session, ctx 64" "$n" --model synthetic:smol-135m --sessions 1 --context 64 \
    --steps 32 --warmup 4 "$@"
  run "smol-135m, 32 sessions, ctx 64" "$n" --model synthetic:smol-135m --sessions 32 \
    --context 64 --steps 16 --warmup 2 "$@"
  # stories260K's steps take ~0.1 ms: 192 of them (the first version of this row) were a 20-50 ms
  # measurement, shorter than a few scheduler slices, so one preemption decided it. 4000 steps
  # over a bounded window (the per-step cost stays that of context 64) take ~0.5-1 s.
  run "stories260K, 1 session, ctx 64, window 64" "$n" "${stories[@]}" --sessions 1 --context 64 \
    --kv window --window 64 --sinks 4 --steps 4000 --warmup 16 "$@"
done
