#!/usr/bin/env bash
# Soak: M minutes (default 10) of session churn against `metronome serve`, then check that the
# server gives everything back. Not part of scripts/test.sh or ctest (it takes minutes).
#   - serve: synthetic:tiny, ephemeral port, 1 engine thread, the serving admission default (aimd +
#     KV guard), window KV W=512 + 4 sinks (rolling, the default), a pool of 544 blocks = 15 such
#     sessions (the guard's bound), so the pool binds and some arrivals are refused and retry.
#   - loadgen: Poisson arrivals with exponential lifetimes, close to what the pool holds, so
#     sessions come and go all the time and some are rejected and retry (or give up).
#   - bad traffic, every 30 s: a client that sends malformed messages and then drops its
#     connection (TCP reset) with a live session, one that sends an over-size message (1009), a
#     half HTTP request (tests/redteam/bad_traffic.py), and a second loadgen killed with SIGKILL
#     mid-run.
#   - every ~10 s a line: server RSS (/proc/PID/status VmRSS), sessions.active, kv.used_blocks.
# Checks (PASS/FAIL each; exit 1 on any FAIL):
#   1. loadgen: no lost frames, no failed connections, no error messages other than
#      frame_too_early refusals, and those (a server stall of > 2 periods on a busy machine
#      causes them) below 0.1% of the frames sent; admitted >= a quarter of the expected arrivals.
#   2. retries: at most 3 rejections per arriving client (loadgen's rejections_per_arrival; a
#      client that polled every period while the pool was full made ~13).
#   3. within 5 s of loadgen's exit: sessions.active == 0 and kv.used_blocks == 0.
#   4. RSS at the end vs after the first minute (warm-up): growth < max(8 MiB, 10%).
#   5. serve exits 0 on SIGTERM (within 10 s).
# Usage: bash scripts/soak.sh [--minutes M] [--binary PATH]
#   Without --binary it builds the release preset (build/release; dependencies: scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=10
bin=""
while (($# > 0)); do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --binary) bin="$2"; shift 2 ;;
    -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown argument '$1' (use --minutes M, --binary PATH)" >&2; exit 2 ;;
  esac
done
if ! awk -v m="$minutes" 'BEGIN { exit (m > 0) ? 0 : 1 }'; then
  echo "soak.sh: --minutes must be > 0" >&2
  exit 2
fi
if [[ -z "$bin" ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target metronome
  bin=build/release/apps/metronome
fi
[[ -x "$bin" ]] || { echo "soak.sh: no executable at '$bin'" >&2; exit 2; }

# The workload. Offered load R x MEAN = 14.4 sessions (+ the bad traffic's) against a pool for
# 16 (the KV guard's bound).
rate=1.2
mean_life_s=12
duration_s=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')
warmup_s=$(awk -v d="$duration_s" 'BEGIN { w = 60; if (w > d / 2) w = d / 2; printf "%d", w }')
min_admitted=$(awk -v r="$rate" -v d="$duration_s" 'BEGIN { printf "%d", r * d / 4 }')
sample_every_s=10
bad_every_s=30

# shellcheck source=lib.sh
source scripts/lib.sh  # serve_start, serve_stop, serve_kill, http_get, jget
tmp="$(mktemp -d /tmp/metronome-soak.XXXXXX)"
loadgen_pid=""
bad_pid=""
cleanup() {
  local p
  # The bad-traffic round's children (its python client, its second loadgen) first.
  [[ -n "$bad_pid" ]] && pkill -TERM -P "$bad_pid" 2>/dev/null || true
  for p in "$bad_pid" "$loadgen_pid"; do
    [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null && kill "$p" 2>/dev/null || true
  done
  for p in "$bad_pid" "$loadgen_pid"; do
    [[ -n "$p" ]] && wait "$p" 2>/dev/null || true
  done
  serve_kill
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

serve_start "$bin" "$tmp/serve" --model synthetic:tiny --port 0 --threads 1 --window 512 \
  --kv-blocks 544 --quiet ||
  { echo "FAIL: serve did not start" >&2; exit 1; }
serve_pid=$SERVE_PID
port=$SERVE_PORT
base="http://127.0.0.1:$port"
url="ws://127.0.0.1:$port"

bad_round() {  # one round of bad traffic, in the background
  {
    timeout 20 python3 tests/redteam/bad_traffic.py "$port" 2>"$tmp/bad.err" |
      sed 's/^/  bad traffic: /' ||
      echo "  bad traffic: round failed: $(tail -n 1 "$tmp/bad.err")"
    curl -s -o /dev/null -w '' "$base/v1/realtime" || true  # a plain GET on the WebSocket path
    curl -s -o /dev/null "$base/no/such/page" || true
    # A second client population killed mid-run: its connections just vanish.
    "$bin" loadgen --url "$url" --sessions 3 --period-ms 40 --duration 30 --report-every 0 \
      --quiet >/dev/null 2>&1 &
    local lg=$!
    sleep 4
    kill -KILL "$lg" 2>/dev/null || true
    wait "$lg" 2>/dev/null || true
  } >>"$tmp/bad.log" 2>&1 &
  bad_pid=$!
}

stat_line() {  # "active used total", or "- - -" when /v1/stats does not answer
  local s
  s="$(http_get /v1/stats |
    jq -r '"\(.sessions.active) \(.kv.used_blocks) \(.kv.total_blocks)"' 2>/dev/null || true)"
  echo "${s:-- - -}"
}
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$serve_pid/status" 2>/dev/null || echo 0; }

echo "soak: $bin, ${minutes} min; serve pid $serve_pid on port $port" \
  "($(grep -m 1 '^pool ' "$tmp/serve.out"))"
echo "loadgen: arrivals poisson:$rate, lifetimes exp:$mean_life_s s, patience 3 s, P=40 ms, a=4," \
  "o=2, window KV (server defaults); bad traffic every ${bad_every_s} s"
"$bin" loadgen --url "$url" --arrival "poisson:$rate" --session-duration "exp:$mean_life_s" \
  --patience-s 3 --period-ms 40 --tokens-per-frame 4 --output-tokens-per-frame 2 --kv window \
  --duration "$duration_s" --seed 7 --report-every 0 --summary-json >"$tmp/loadgen.out" \
  2>"$tmp/loadgen.err" &
loadgen_pid=$!
start=$(date +%s.%N)
elapsed() { awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }

printf '%8s %10s %8s %14s\n' t_s rss_mib active kv_used_blocks
rss_warm=""
next_sample=0
next_bad=$bad_every_s
while kill -0 "$loadgen_pid" 2>/dev/null; do
  t=$(elapsed)
  if awk -v t="$t" -v n="$next_sample" 'BEGIN { exit (t >= n) ? 0 : 1 }'; then
    rss=$(rss_kb)
    read -r active used total < <(stat_line) || true
    printf '%8.0f %10.1f %8s %9s / %s\n' "$t" "$(awk -v k="$rss" 'BEGIN { print k / 1024 }')" \
      "$active" "$used" "$total"
    if [[ -z "$rss_warm" ]] && awk -v t="$t" -v w="$warmup_s" 'BEGIN { exit (t >= w) ? 0 : 1 }'; then
      rss_warm=$rss
    fi
    next_sample=$((next_sample + sample_every_s))
  fi
  if awk -v t="$t" -v n="$next_bad" -v d="$duration_s" \
    'BEGIN { exit (t >= n && t < d - 10) ? 0 : 1 }'; then
    if [[ -z "$bad_pid" ]] || ! kill -0 "$bad_pid" 2>/dev/null; then bad_round; fi
    next_bad=$((next_bad + bad_every_s))
  fi
  sleep 0.5
done
lg_rc=0
wait "$loadgen_pid" || lg_rc=$?
loadgen_pid=""
if [[ -n "$bad_pid" ]]; then wait "$bad_pid" 2>/dev/null || true; bad_pid=""; fi

# Drained: within 5 s, no session and no KV block left.
drained=""
drain_t0=$(date +%s.%N)
for _ in $(seq 1 50); do
  read -r active used total < <(stat_line) || true
  if [[ "$active" == 0 && "$used" == 0 ]]; then
    drained=$(awk -v s="$drain_t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.2f", n - s }')
    break
  fi
  sleep 0.1
done
rss_end=$(rss_kb)
printf '%8.0f %10.1f %8s %9s / %s   (after loadgen exited)\n' "$(elapsed)" \
  "$(awk -v k="$rss_end" 'BEGIN { print k / 1024 }')" "$active" "$used" "$total"

# Shut down.
serve_rc=0
serve_stop 10 || serve_rc=$?
[[ "$serve_rc" == 124 ]] && serve_rc="still running 10 s after SIGTERM (killed)"

echo
echo "bad traffic rounds:"
echo "  $(grep -c 'bad traffic: round' "$tmp/bad.log" 2>/dev/null || true) rounds; what they got back:"
grep 'bad traffic: round' "$tmp/bad.log" 2>/dev/null | sed 's/^ *bad traffic: round: *//' | sort |
  uniq -c | sed 's/^ */    x/' | head -n 8 || true
echo "loadgen (exit $lg_rc):"
grep -v '^{' "$tmp/loadgen.out" | sed 's/^/  /' || true
sed 's/^/  stderr: /' "$tmp/loadgen.err" | head -n 5
j="$(tail -n 1 "$tmp/loadgen.out")"
[[ "$j" == "{"* ]] || j="{}"
g() { jget "$j" ".$1 // \"missing\""; }

fail=0
check() {  # check NAME CONDITION-EXIT-STATUS DETAIL
  if [[ "$2" == 0 ]]; then echo "PASS  $1: ${*:3}"; else echo "FAIL  $1: ${*:3}"; fail=1; fi
}
echo
errors=$(g errors)
refused=$(g refused_frames)
sent=$(g frames_sent)
lost=$(g lost_frames)
cfail=$(g connect_failures)
admitted=$(g admitted)
ok=1
awk -v e="$errors" -v r="$refused" -v s="$sent" -v l="$lost" -v c="$cfail" -v a="$admitted" \
  -v m="$min_admitted" -v rc="$lg_rc" \
  'BEGIN { exit (rc == 0 && e - r == 0 && r <= 0.001 * s && l == 0 && c == 0 && a >= m) ? 0 : 1 }' \
  2>/dev/null && ok=0
check "loadgen" "$ok" "exit $lg_rc, errors $errors (of which frame_too_early refusals $refused," \
"<= 0.1% of $sent sent), lost $lost, failed connections $cfail, admitted $admitted (>= $min_admitted)," \
"rejections $(g rejected), gave up $(g abandoned); frames $(g frames): late $(g late_frames)," \
"starved $(g starved_frames), short $(g short_frames); p99 client $(g p99_frame_latency_ms) ms"
ok=1
# One awk both reads the figure (a number, or "missing" when the key is null) and judges it.
per_arrival=$(awk -v p="$(g rejections_per_arrival)" 'BEGIN { if (p !~ /^[0-9.eE+-]+$/) { print p; exit 1 }
  printf "%.2f", p; exit (p + 0 <= 3) ? 0 : 1 }') && ok=0
check "retries" "$ok" "$(g rejected) rejections for $(g arrivals) arriving clients:" \
  "$per_arrival per arrival (<= 3)"
ok=1
[[ -n "$drained" ]] && ok=0
when="after 5 s"
[[ -n "$drained" ]] && when="(empty ${drained} s after loadgen exited)"
check "drained" "$ok" "sessions.active $active, kv.used_blocks $used / $total $when"
ok=1
[[ -n "$rss_warm" ]] || rss_warm=$rss_end
bound_kb=$(awk -v w="$rss_warm" 'BEGIN { b = 0.10 * w; if (b < 8192) b = 8192; printf "%d", b }')
awk -v w="$rss_warm" -v e="$rss_end" -v b="$bound_kb" 'BEGIN { exit (e - w < b) ? 0 : 1 }' && ok=0
check "rss" "$ok" "$(awk -v w="$rss_warm" -v e="$rss_end" -v b="$bound_kb" -v t="$warmup_s" \
  'BEGIN { printf "%.1f MiB at t=%d s -> %.1f MiB at the end (%+.1f MiB; bound %.1f MiB)",
           w / 1024, t, e / 1024, (e - w) / 1024, b / 1024 }')"
ok=1
[[ "$serve_rc" == 0 ]] && ok=0
check "shutdown" "$ok" "serve exit status on SIGTERM: $serve_rc"
if ((fail)); then
  echo "soak: FAIL"
  echo "--- serve stderr (last 20 lines):"
  tail -n 20 "$tmp/serve.err"
  exit 1
fi
echo "soak: PASS"
