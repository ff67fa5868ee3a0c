#!/usr/bin/env bash
# Issue 11 items 2 and 3 against a live server: a victim window session (loadgen, period 40 ms,
# 2 tokens in, 1 out) alone, then beside 8 hostile clients of each kind (hog_attacks.py): full-KV
# sessions declaring 10000 ms / 1 token and sending back to back; sessions declaring 1 token per
# frame and sending ~4000-token texts. Prints the victim's client-side summary and what the hogs
# got, plus the server's RSS before and after.
# Usage: experiments/hog_attacks.sh [metronome binary] [seconds per run]
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build/ci/apps/metronome}"
secs="${2:-10}"
# shellcheck source=../scripts/lib.sh
source scripts/lib.sh  # serve_start, serve_kill
tmp="$(mktemp -d)"
trap 'serve_kill; rm -rf "$tmp"' EXIT
serve_start "$bin" "$tmp/serve" --model synthetic:tiny --port 0 --threads 1 --admission memory \
  --quiet
port=$SERVE_PORT
serve_pid=$SERVE_PID
rss() { awk '/VmRSS/ { print $2 " kB" }' "/proc/$serve_pid/status"; }
victim() {
  "$bin" loadgen --url "ws://127.0.0.1:$port" --sessions 1 --period-ms 40 --tokens-per-frame 2 \
    --output-tokens-per-frame 1 --kv window --window 64 --sinks 4 --duration "$secs" \
    --summary-json --report-every 0 2>/dev/null | tail -n 1 |
    jq -c '{frames, ok_frames, late_frames, starved_frames, refused_frames, lost_frames,
      p50_frame_latency_ms, p99_frame_latency_ms, deadline_ms}'
}
echo "server RSS at start: $(rss)"
echo "victim alone:          $(victim)"
for attack in kv text; do
  python3 experiments/hog_attacks.py --url "ws://127.0.0.1:$port" --attack "$attack" --hogs 8 \
    --seconds "$((secs + 2))" >"$tmp/hogs_$attack.json" &
  hogs=$!
  sleep 1
  echo "victim beside $attack hogs: $(victim)"
  wait "$hogs"
  echo "  $attack hogs: $(cat "$tmp/hogs_$attack.json")"
done
echo "server RSS at the end: $(rss)"
