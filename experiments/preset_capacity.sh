#!/usr/bin/env bash
# For every built-in simulator preset: when full KV hits the wall at N=100 sessions (observed vs
# the online forecast vs the closed-form t_sat), and the capacity with window KV: N_true, the
# largest fixed population whose p99 frame latency stays <= 0.85 x deadline (bisection over N;
# memory admission keeps the pool from overfilling, so a population beyond N_mem is capped there),
# and where AIMD (with the KV look-ahead guard, the default control window) settles from a warm start
# of 10 under arrivals at about twice N_true.
# Usage: experiments/preset_capacity.sh [metronome binary]   (prints a markdown table)
set -euo pipefail
bin="${1:-build/release/apps/metronome}"
# shellcheck source=../scripts/lib.sh
source "$(dirname "$0")/../scripts/lib.sh"  # jget

p99_ok() {  # p99_ok PRESET N: exit 0 when N window sessions keep p99 <= 0.85 D with no starving
  local j
  j="$("$bin" sim --preset "$1" --sessions "$2" --kv window --admission "static:$2" \
    --duration "$3" --summary-json --quiet | tail -n 1)"
  awk -v p="$(jget "$j" p99_frame_latency_ms)" -v d="$(jget "$j" deadline_ms)" \
    -v s="$(jget "$j" starved_frames)" 'BEGIN { exit (p <= 0.85 * d && s == 0) ? 0 : 1 }'
}

echo "| preset | full KV N=100: first starved | forecast | AIMD limit (2nd half mean) | N_true (window) | AIMD / N_true |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for preset in moshi-7b qwen25-omni-7b minicpm-o-4.5 qwen3-omni-30b-a3b; do
  # period ms, tokens appended per frame, window tokens, from the preset listing.
  read -r period per_frame window < <("$bin" sim --list-presets --json | jq -r --arg p "$preset" \
    '.presets[] | select(.name == $p)
     | "\(.period_ms) \(.tokens_per_frame + .output_tokens_per_frame) \(.window)"')
  # Long enough for 30 frames and for the windows to fill twice over (bounded state reached).
  run_s=$(awk -v p="$period" -v t="$per_frame" -v w="$window" 'BEGIN {
    r = p * 30 / 1000; f = 2 * w / (t * 1000 / p); if (f > r) r = f; if (r < 60) r = 60;
    printf "%d", r }')
  full="$("$bin" sim --preset "$preset" --sessions 100 --kv full --admission static:100 \
    --duration 3000 --summary-json --quiet | tail -n 1)"
  lo=1
  hi=64
  while p99_ok "$preset" "$hi" "$run_s"; do hi=$((hi * 2)); done
  while ((hi - lo > 1)); do
    mid=$(((lo + hi) / 2))
    if p99_ok "$preset" "$mid" "$run_s"; then lo=$mid; else hi=$mid; fi
  done
  rate=$(awk -v n="$lo" 'BEGIN { printf "%.3f", 2.0 * n / 300.0 }')  # offered ~2 N_true, 300 s mean
  aimd="$("$bin" sim --preset "$preset" --arrival "poisson:$rate" --session-duration exp:300 \
    --kv window --admission aimd --kv-guard --aimd-initial 10 \
    --duration $((run_s * 20)) --summary-json \
    --quiet | tail -n 1)"
  lim="$(jget "$aimd" limit_mean_second_half)"
  printf '| %s | %.0f s | %.0f s | %.1f | %d | %.2f |\n' "$preset" \
    "$(jget "$full" first_starved_at_s)" "$(jget "$full" t_sat_predicted_s)" "$lim" "$lo" \
    "$(awk -v a="$lim" -v b="$lo" 'BEGIN { print a / b }')"
done
