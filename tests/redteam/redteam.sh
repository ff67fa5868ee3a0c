#!/usr/bin/env bash
# Red team (issue 11): starts `metronome serve --model synthetic:tiny` on loopback, replays the
# hostile-client attacks of tests/redteam/attacks.py against it, checks its health afterwards
# (/healthz 200, a legitimate session works, open fds back to baseline, RSS, 0 KV blocks used),
# then sends SIGTERM with a client holding a session: that client must see session.ended
# (server_shutdown) and a 1001 close frame, and the server must exit 0 within 5 s.
# Usage: redteam.sh <metronome binary> [--short] [--only edge|hog|squat|work|all]
#   --short: CI mode (well under 60 s). --only edge: the connection-edge attacks (part B of issue
#   11); hog: the per-session leak and KV/compute hogs (part A); squat: idle sessions and
#   session-less WebSockets holding every slot (issue 36, attack 4), against the short idle
#   timeouts below; work: issue 36's admission attacks (work_attacks.py) against the serving
#   defaults.
# Loopback only; stops by itself (every step has a timeout; the server is killed on exit).
set -uo pipefail
bin="$1"
shift
short=""
section="all"
while [ $# -gt 0 ]; do
  case "$1" in
    --short) short="--short" ;;
    --only) section="$2"; shift ;;
    *) echo "redteam: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../../scripts/lib.sh
source "$here/../../scripts/lib.sh"  # serve_start, serve_kill
tmp="$(mktemp -d)"
cleanup() {
  serve_kill
  rm -rf "$tmp"
}
trap cleanup EXIT
max_connections=16  # WebSockets, and plain HTTP connections (the slowloris attack exceeds it)
handshake_ms=1000
# Short idle timeouts so the squat section runs in seconds: a 10 s-period session that sends
# nothing ends after idle_max_ms (2 periods, clamped), a connection with no session closes after
# connection_idle_ms. Every other section's clients send within these.
idle_max_ms=2000
connection_idle_ms=2000
limit=64
# Dropped sessions wait this long for session.resume, at most max_detached of them per address.
resume_window_s=2
max_detached=8
agent_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

if ! serve_start "$bin" "$tmp/serve" --model synthetic:tiny --host 127.0.0.1 --port 0 --threads 1 \
  --kv-blocks 256 --window 512 --admission "static:$limit" --max-connections "$max_connections" \
  --max-http-connections "$max_connections" \
  --handshake-timeout-ms "$handshake_ms" --drain-timeout-s 0 --quiet --agent-port "$agent_port" \
  --idle-periods 2 --idle-min-ms 500 --idle-max-ms "$idle_max_ms" \
  --connection-idle-ms "$connection_idle_ms" --resume-window-s "$resume_window_s" \
  --max-detached-per-address "$max_detached"; then
  echo "FAIL: serve did not start"
  exit 1
fi
serve_pid=$SERVE_PID
port=$SERVE_PORT

rc=0
if [ "$section" != work ]; then  # work_attacks.py runs below, against its own server
  timeout 600 python3 "$here/attacks.py" --port "$port" --pid "$serve_pid" --section "$section" \
    --max-connections "$max_connections" --handshake-timeout-ms "$handshake_ms" \
    --agent-port "$agent_port" --idle-max-ms "$idle_max_ms" \
    --connection-idle-ms "$connection_idle_ms" --limit "$limit" \
    --resume-window-s "$resume_window_s" --max-detached-per-address "$max_detached" $short || rc=1
fi

# Weights that hold NaN (issue 36, item 7): nonfinite.py serves its own patched files.
if [ "$section" = all ]; then timeout 120 python3 "$here/nonfinite.py" --bin "$bin" || rc=1; fi

# Graceful shutdown, as docs/protocol.md promises (with --drain-timeout-s 0: at once, no drain).
timeout 40 python3 "$here/attacks.py" --port "$port" --shutdown-client "$tmp/ready" &
client_pid=$!
for _ in $(seq 1 100); do
  [ -s "$tmp/ready" ] && break
  sleep 0.05
done
t0=$(date +%s.%N)
serve_rc=0
serve_stop 5 || serve_rc=$?
if [ "$serve_rc" -ne 124 ]; then
  echo "PASS: serve exited within 5 s of SIGTERM ($(awk -v a="$t0" -v b="$(date +%s.%N)" \
    'BEGIN { printf "%.2f", b - a }') s)"
  if [ "$serve_rc" -eq 0 ]; then echo "PASS: serve exit status 0"; else
    echo "FAIL: serve exit status $serve_rc"; rc=1; fi
else
  echo "FAIL: serve still running 5 s after SIGTERM (killed)"; rc=1
fi
if wait "$client_pid"; then echo "PASS: the client saw session.ended (server_shutdown) and 1001"
else echo "FAIL: the client did not see session.ended (server_shutdown) and 1001"; rc=1; fi

# Issue 36's admission attacks (an impossible deadline, a heavy session, prompt churn, retry
# hints) against the serving defaults: aimd over a work budget priced by the start-up calibration.
# --max-sessions: the hint attack fills the server.
if [ "$section" = work ] || [ "$section" = all ]; then
  work_max_sessions=24
  if serve_start "$bin" "$tmp/serve_work" --model synthetic:tiny --host 127.0.0.1 --port 0 \
    --threads 1 --max-sessions "$work_max_sessions" --drain-timeout-s 0 --quiet; then
    timeout 300 python3 "$here/work_attacks.py" --port "$SERVE_PORT" \
      --max-sessions "$work_max_sessions" $short || rc=1
    serve_kill
  else
    echo "FAIL: serve (serving defaults) did not start"; rc=1
  fi
fi
[ "$rc" -eq 0 ] && echo "redteam: all checks passed" || echo "redteam: FAILED"
exit "$rc"
