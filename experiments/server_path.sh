#!/usr/bin/env bash
# What the network server path costs, on synthetic:tiny with one engine thread.
#   (a) Latency the server path adds to a frame: the same workload in-process (`metronome drive`)
#       and over WebSocket (`metronome serve` + `metronome loadgen` on loopback), REPEATS times,
#       medians. drive's latency runs from a frame's arrival to its result; loadgen reports the
#       server's own (arrival at the server to result sent, server clock) and the client's (send to
#       result received, client clock). Server path overhead = client - drive. Both run cold
#       (a fresh process each repeat), as drive cannot be warmed up.
#   (b) The largest frame rate the server sustains: N sessions at P = 20 ms (a = 1, o = 1, window
#       KV W=64 + 4 sinks), N doubling-ish upward until a point fails. A point is sustained when
#       every session was admitted, every sent frame was answered (no lost or refused frames, no
#       errors, no failed connections), late + starved + short < 1% of frames and the client's p99
#       < the deadline (= P). Each point gets a fresh server, warmed up by a 2 s run of the same
#       N first (a fresh engine's first steps take tens of ms: a one-off stall, not a rate). A
#       failing point is run once more before the sweep stops. Also shows the CPU each process
#       used (cores busy = CPU s / wall s): the client shares the machine.
# Usage: experiments/server_path.sh [metronome binary] [REPEATS] [POINT_SECONDS]
#   (defaults: build/release/apps/metronome, 3, 15; about 8 minutes in all)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build/release/apps/metronome}"
repeats="${2:-3}"
point_s="${3:-15}"
[[ -x "$bin" ]] || { echo "no executable at '$bin' (build: cmake --preset release && cmake --build --preset release --target metronome)" >&2; exit 2; }

# shellcheck source=../scripts/lib.sh
source scripts/lib.sh  # serve_start, serve_stop, serve_kill, jget
tmp="$(mktemp -d /tmp/metronome-server-path.XXXXXX)"
cleanup() {
  serve_kill
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_serve() {  # start_serve [serve flags...]: sets SERVE_PID and port
  serve_start "$bin" "$tmp/serve" --model synthetic:tiny --port 0 --threads 1 --quiet "$@" || exit 1
  port=$SERVE_PORT
}
stop_serve() {
  local rc=0
  serve_stop || rc=$?
  if ((rc != 0)); then echo "serve exited with status $rc on SIGTERM" >&2; fi
}
cpu_s() {  # CPU seconds (user + system) a live process has used
  awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# ---------------------------------------------------------------------------------------------
shape=(--period-ms 40 --tokens-per-frame 1 --output-tokens-per-frame 1 --kv window --window 64
  --sinks 4)
echo "## (a) Server path vs in-process: 8 sessions, P=40 ms, a=1, o=1, window W=64 S=4, 20 s," \
  "--threads 1; $repeats repeats"
echo
printf '| run | drive p50 | drive p99 | server p50 | server p99 | client p50 | client p99 | client - drive p50 | client - drive p99 | send lag p99 |\n'
printf '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
: >"$tmp/a.txt"
for r in $(seq 1 "$repeats"); do
  d="$("$bin" drive --model synthetic:tiny --sessions 8 "${shape[@]}" --duration 20 --threads 1 \
    --seed "$r" --summary-json --quiet | tail -n 1)"
  start_serve
  l="$("$bin" loadgen --url "ws://127.0.0.1:$port" --sessions 8 "${shape[@]}" --duration 20 \
    --seed "$r" --report-every 0 --summary-json | tail -n 1)"
  stop_serve
  lost=$(jget "$l" lost_frames)
  errs=$(jget "$l" errors)
  line="$(jget "$d" p50_frame_latency_ms) $(jget "$d" p99_frame_latency_ms)"
  line+=" $(jget "$l" p50_server_latency_ms) $(jget "$l" p99_server_latency_ms)"
  line+=" $(jget "$l" p50_frame_latency_ms) $(jget "$l" p99_frame_latency_ms) $(jget "$l" p99_send_lag_ms)"
  echo "$line" >>"$tmp/a.txt"
  awk -v r="$r" -v lost="$lost" -v errs="$errs" '{
    printf "| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %+.2f | %+.2f | %.2f |%s\n", r, $1, $2,
      $3, $4, $5, $6, $5 - $1, $6 - $2, $7,
      (lost + errs > 0) ? sprintf(" (lost %d, errors %d)", lost, errs) : "" }' <<<"$line"
done
meds=""
for c in 1 2 3 4 5 6 7; do meds+="$(awk -v c="$c" '{ print $c }' "$tmp/a.txt" | median) "; done
awk '{ printf "| **median** | **%.2f** | **%.2f** | **%.2f** | **%.2f** | **%.2f** | **%.2f** | **%+.2f** | **%+.2f** | **%.2f** |\n",
  $1, $2, $3, $4, $5, $6, $5 - $1, $6 - $2, $7 }' <<<"$meds"
echo
echo "(ms; drive: frame arrival to result, in-process; server: arrival at the server to result" \
  "sent; client: send to result received; differences of the medians)"

# ---------------------------------------------------------------------------------------------
period=20
echo
echo "## (b) Largest sustained frame rate: N sessions at P=$period ms, a=1, o=1, window W=64 S=4," \
  "${point_s} s per point, --threads 1"
echo
printf '| N | frames/s offered | answered/s | admitted | lost+refused | errors | late+starved+short | client p50 | client p99 | server p99 | send lag p99 | serve CPU (cores) | loadgen CPU (cores) | verdict |\n'
printf '| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n'
run_point() {  # run_point N: prints a table row; exit 0 when sustained
  local n=$1 l s0 s1 t0 t1 lg_cpu
  start_serve --max-connections $((2 * n + 64)) --kv-blocks $((n * 8 + 64))
  # Warm-up, not measured: a fresh engine's first steps take tens of ms (see docs/performance.md).
  "$bin" loadgen --url "ws://127.0.0.1:$port" --sessions "$n" --period-ms "$period" \
    --kv window --window 64 --sinks 4 --duration 2 --report-every 0 >/dev/null
  sleep 0.5
  s0=$(cpu_s "$SERVE_PID")
  t0=$(date +%s.%N)
  # loadgen's CPU from /usr/bin/time (user + system), on stderr's last line.
  l="$(/usr/bin/time -f 'cpu %U %S' -o "$tmp/time.txt" "$bin" loadgen \
    --url "ws://127.0.0.1:$port" --sessions "$n" --period-ms "$period" --tokens-per-frame 1 \
    --output-tokens-per-frame 1 --kv window --window 64 --sinks 4 --duration "$point_s" \
    --report-every 0 --summary-json | tail -n 1)"
  t1=$(date +%s.%N)
  s1=$(cpu_s "$SERVE_PID")
  stop_serve
  lg_cpu=$(awk '/^cpu/ { print $2 + $3 }' "$tmp/time.txt")
  jq -r --argjson n "$n" --argjson p "$period" --argjson dur "$point_s" \
    --argjson scpu "$(awk -v a="$s0" -v b="$s1" -v t0="$t0" -v t1="$t1" 'BEGIN { print (b - a) / (t1 - t0) }')" \
    --argjson lcpu "$(awk -v c="$lg_cpu" -v t0="$t0" -v t1="$t1" 'BEGIN { print c / (t1 - t0) }')" '
    def r2: if . == null then "-" else (. * 100 | round / 100) end;
    (.late_frames + .starved_frames + .short_frames) as $bad
    | (.lost_frames + .refused_frames) as $lost
    | ([ (if .admitted < $n then "admitted \(.admitted) < \($n)" else empty end),
         (if $lost > 0 or .frames < .frames_sent then "\($lost) frames unanswered" else empty end),
         (if .errors > 0 then "\(.errors) errors" else empty end),
         (if .connect_failures > 0 then "\(.connect_failures) failed connections" else empty end),
         (if .frames == 0 or $bad >= 0.01 * .frames
          then "late+starved+short \(if .frames > 0 then ($bad * 1000 / .frames | round) / 10 else 100 end)%"
          else empty end),
         (if (.p99_frame_latency_ms // 1e9) >= .deadline_ms
          then "client p99 \(.p99_frame_latency_ms) >= \(.deadline_ms) ms" else empty end) ]) as $why
    | "| \($n) | \($n * 1000 / $p) | \(.frames / $dur | round) | \(.admitted) | \($lost) | \(.errors) | \($bad) (\(if .frames > 0 then ($bad * 10000 / .frames | round) / 100 else 0 end)%) | \(.p50_frame_latency_ms | r2) | \(.p99_frame_latency_ms | r2) | \(.p99_server_latency_ms | r2) | \(.p99_send_lag_ms | r2) | \($scpu | r2) | \($lcpu | r2) | \(if ($why | length) == 0 then "sustained" else "FAIL: " + ($why | join("; ")) end) |"
  ' <<<"$l" | tee "$tmp/row.txt"
  grep -q '| sustained |$' "$tmp/row.txt"
}
best=0
first_fail=""
for n in 8 16 32 64 128 192 256 320 384 448 512 640 768 1024; do
  if run_point "$n"; then
    best=$n
  elif run_point "$n"; then  # one retry: the machine is shared and noisy
    best=$n
  else
    first_fail=$n
    break
  fi
done
echo
echo "largest sustained N: $best sessions = $((best * 1000 / period)) frames/s" \
  "(P = $period ms, a = o = 1)${first_fail:+; first failing N: $first_fail (twice; the reason is in its rows)}"
