#!/usr/bin/env bash
# The main job: set up, build (release) and show the point of Metronome, first over the network on
# the built-in default model, then at GPU scale in the simulator.
#
# Part 1, the real thing: `metronome serve` on synthetic:tiny (the real CPU engine and clock) and
# `metronome loadgen` streaming paced sessions to it over WebSocket, measured on the client side.
# Open the dashboard URL it prints to watch it happen.
#   1. Full KV (today's KV-pool engines): sessions stream fine until the KV pool is full, then every
#      frame comes back empty, on time: no deadline misses, the conversation is mute. Metronome
#      counts the starved frames and raises the mute alarm (on the wire, in the metrics, on the
#      dashboard), near the time its saturation forecast predicted.
#   2. Window KV (W recent + S sink tokens): the same sessions never starve.
#   3. With bounded KV, latency rises smoothly with the number of sessions: a load signal.
#   4. AIMD admission on that signal finds the sustainable concurrency by itself.
# Part 2, GPU scale: the same code on a virtual clock with a cost model of one H200 serving
# Moshi-7B (`metronome sim`; --list-presets says which numbers are assumptions).
#
# Environment: METRONOME_DEMO_PORT (default 0: any free port), METRONOME_DEMO_QUICK=1 (shorter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target metronome
m=build/release/apps/metronome
quick="${METRONOME_DEMO_QUICK:-0}"
scale() { if [ "$quick" = 1 ]; then echo "$(($1 / 2))"; else echo "$1"; fi; }

banner() { printf '\n=== %s\n' "$*"; }
jget() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -n 1 | cut -d: -f2-; }

server_pid=""
cleanup() { if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi; }
trap cleanup EXIT

# start_server ARGS...: serve synthetic:tiny in the background; sets $port.
start_server() {
  local log
  log="$(mktemp)"
  "$m" serve --model synthetic:tiny --port "${METRONOME_DEMO_PORT:-0}" --threads 1 \
    --max-connections 1024 --quiet "$@" >"$log" 2>&1 &
  server_pid=$!
  port=""
  for _ in $(seq 1 100); do
    port="$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$log"; echo "serve did not start" >&2; exit 1; }
  grep '^metronome serve' "$log"
  echo ">>> dashboard: http://127.0.0.1:$port/   (live charts; the run below takes a while)"
}
stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid" || true
  server_pid=""
}
lg() {  # lg ARGS...: loadgen with its progress and summary shown; its summary JSON into $last
  local out
  out="$(mktemp)"
  "$m" loadgen --url "ws://127.0.0.1:$port" --summary-json "$@" | tee "$out" | grep -v '^{'
  last="$(tail -n 1 "$out")"
  rm -f "$out"
}
stats() {  # GET /v1/stats with bash's /dev/tcp (no curl needed)
  exec 3<>"/dev/tcp/127.0.0.1/$port"
  printf 'GET /v1/stats HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
  sed -n '/^\r$/,$p' <&3 | tail -n 1
  exec 3<&-
}

# Two session shapes, both with a 40 ms period and deadline: a light, speech-like one (4 codec
# tokens in, 1 out per frame: a full-KV session grows 125 tokens/s) for the KV wall, and a heavy
# one (64 in, 4 out) whose compute reaches the deadline at a few dozen sessions on 2 cores.
light=(--period-ms 40 --tokens-per-frame 4 --output-tokens-per-frame 1)
heavy=(--period-ms 40 --tokens-per-frame 64 --output-tokens-per-frame 4 --kv window --window 128
  --sinks 4)
rows=()
row() {  # row NAME JSON VERDICT
  rows+=("$(printf '%-34s %8s %8s %9s %7s %7s %8s %9s  %s' "$1" "$(jget "$2" admitted)" \
    "$(jget "$2" frames)" "$(jget "$2" starved_frames)" "$(jget "$2" mute_alarms)" \
    "$(jget "$2" deadline_misses)" "$(printf '%.1f' "$(jget "$2" p99_frame_latency_ms)")" \
    "$(jget "$2" rejected)" "$3")")
}

banner "Part 1: metronome serve on synthetic:tiny, driven by metronome loadgen over WebSocket"
# A pool of 1280 blocks x 16 tokens: 16 full-KV light sessions (2000 tokens/s) fill it in ~10 s.
start_server --kv-blocks 1280 --admission static:64
n_full=16
banner "1. Full KV: $n_full sessions, a 1280-block KV pool, sessions never end"
lg "${light[@]}" --sessions "$n_full" --kv full --duration "$(scale 16)" --report-every 2
full="$last"
s="$(stats)"
echo "server: forecast t_sat $(jget "$s" t_sat_s) s, KV peak $(jget "$s" peak_fraction)," \
  "mute alarms $(jget "$s" mute_alarms)"
row "1. full KV, $n_full sessions" "$full" \
  "$([ "$(jget "$full" starved_frames)" -gt 0 ] && echo "WALL: mute, 0 misses" || echo "no wall")"

banner "2. Window KV (W=64 + 4 sinks): the same $n_full sessions"
lg "${light[@]}" --sessions "$n_full" --kv window --window 64 --sinks 4 --duration "$(scale 16)" \
  --report-every 4
window="$last"
row "2. window KV, $n_full sessions" "$window" \
  "$([ "$(jget "$window" starved_frames)" -eq 0 ] && echo "never starves" || echo "STARVED")"

banner "3. Window KV (W=128 + 4), heavy frames: client-side p99 vs sessions (deadline 40 ms)"
printf '%9s %9s %9s %8s %8s %8s\n' sessions frames p50_ms p99_ms late starved
best=0
sweep=()
for n in 8 16 24 32 40 48 56 64; do
  j="$("$m" loadgen --url "ws://127.0.0.1:$port" "${heavy[@]}" --sessions "$n" \
    --duration "$(scale 6)" --report-every 0 --summary-json | tail -n 1)"
  p99="$(jget "$j" p99_frame_latency_ms)"
  printf '%9s %9s %9.1f %8.1f %8s %8s\n' "$n" "$(jget "$j" frames)" \
    "$(jget "$j" p50_frame_latency_ms)" "$p99" "$(jget "$j" late_frames)" \
    "$(jget "$j" starved_frames)"
  if awk -v p="$p99" 'BEGIN { exit !(p <= 0.85 * 40) }'; then best=$n; fi
  sweep+=("$n:$(printf '%.0f' "$p99")")
done
echo "largest N above with p99 <= 0.85 D: $best"
rows+=("$(printf '%-34s %s' "3. window KV, heavy, N=8..64" \
  "p99 ms by N: ${sweep[*]}; largest N with p99 <= 0.85 D: $best")")
stop_server

banner "4. AIMD admission, heavy frames: clients arrive at 4/s, live ~30 s, retry when turned away"
start_server --kv-blocks 1280 --admission aimd --aimd-initial 16 --aimd-window-s 1
lg "${heavy[@]}" --arrival poisson:4 --session-duration exp:30 --patience-s 30 \
  --duration "$(scale 60)" --report-every 5
aimd="$last"
s="$(stats)"
echo "server: AIMD limit now $(jget "$s" limit) after $(jget "$s" limit_changes) changes" \
  "(step 3: largest N with p99 <= 0.85 D was $best)"
row "4. AIMD, arrivals 4/s" "$aimd" "limit $(jget "$s" limit) (sweep: $best)"
stop_server

banner "Summary (client side; deadline 40 ms)"
printf '%-34s %8s %8s %9s %7s %7s %8s %9s  %s\n' scenario admitted frames starved alarms misses \
  p99_ms rejected verdict
printf '%s\n' "${rows[@]}"

banner "Part 2: GPU scale in the simulator (Moshi-7B on one H200, virtual clock)"
moshi=(sim --preset moshi-7b)
echo "-- full KV, 200 sessions, pool 84.6 GB:"
"$m" "${moshi[@]}" --sessions 200 --kv full --admission static:200 --duration 120 --quiet |
  tail -n 4
echo "-- window KV (W=1000 + 4 sinks), the same 200 sessions:"
"$m" "${moshi[@]}" --sessions 200 --kv window --admission static:200 --duration 120 --quiet |
  tail -n 4
echo "-- window KV, p99 frame latency vs sessions (deadline 80 ms):"
printf '%9s %10s %10s %14s %14s\n' sessions p50_ms p99_ms late_frames starved_frames
for n in 50 100 150 200 220 240 260 280; do
  j="$("$m" "${moshi[@]}" --sessions "$n" --kv window --admission "static:$n" --duration 60 \
    --summary-json --quiet | tail -n 1)"
  printf '%9s %10.1f %10.1f %14s %14s\n' "$n" "$(jget "$j" p50_frame_latency_ms)" \
    "$(jget "$j" p99_frame_latency_ms)" "$(jget "$j" late_frames)" "$(jget "$j" starved_frames)"
done
echo "-- AIMD, arrivals 4/s living ~90 s (far more than fit):"
"$m" "${moshi[@]}" --arrival poisson:4 --session-duration lognormal:4.5,0.5 --kv window \
  --admission aimd --aimd-initial 100 --duration 600 --quiet | tail -n 4
