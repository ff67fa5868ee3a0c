# shellcheck shell=bash
# The shell library of Metronome's scripts (sourced, not run): start `metronome serve` and wait for
# its port, stop it, read JSON. One place for each, so no script scrapes text or re-implements them.
#   source "$(dirname "$0")/lib.sh"          (from scripts/; adjust the path elsewhere)
# Needs bash, jq and curl (scripts/setup.sh installs both). Sets nothing else on source.

# serve_start BINARY PREFIX SERVE_ARGS...: starts `BINARY serve SERVE_ARGS... --port-file
# PREFIX.port` in the background, stdout to PREFIX.out and stderr to PREFIX.err, and waits until
# it is listening (the port file appears: serve writes it atomically once the socket is bound).
# Sets SERVE_PID and SERVE_PORT. Gives up after METRONOME_SERVE_START_S seconds (default 120: a
# sanitizer build loads and warms the model slowly) or as soon as serve exits, with a message on
# stderr that shows the tail of serve's stderr; returns 1 then (the server is not left running).
SERVE_PID=""
SERVE_PORT=""
serve_start() {
  local bin="$1" prefix="$2" limit_s="${METRONOME_SERVE_START_S:-120}" t0=$SECONDS
  shift 2
  rm -f "$prefix.port"
  "$bin" serve "$@" --port-file "$prefix.port" >"$prefix.out" 2>"$prefix.err" &
  SERVE_PID=$!
  SERVE_PORT=""
  while ((SECONDS - t0 < limit_s)); do
    if [[ -s "$prefix.port" ]]; then
      SERVE_PORT="$(<"$prefix.port")"
      return 0
    fi
    if ! kill -0 "$SERVE_PID" 2>/dev/null; then
      local rc=0
      wait "$SERVE_PID" || rc=$?
      SERVE_PID=""
      _serve_start_failed "$prefix" "serve exited with status $rc before listening"
      return 1
    fi
    sleep 0.05
  done
  kill -KILL "$SERVE_PID" 2>/dev/null || true
  wait "$SERVE_PID" 2>/dev/null || true
  SERVE_PID=""
  _serve_start_failed "$prefix" "serve was not listening after ${limit_s} s (killed)"
  return 1
}
_serve_start_failed() {  # PREFIX WHY
  {
    echo "error: $2; its stderr ($1.err) ends:"
    tail -n 20 "$1.err" | sed 's/^/  | /'
  } >&2
}

# serve_stop [TIMEOUT_S]: SIGTERM to SERVE_PID and wait for it to exit (default 15 s; serve shuts
# down in about 3 s at most); SIGKILL if it has not. Returns serve's exit status (0 on a clean
# shutdown), 124 when it had to be killed. Clears SERVE_PID. No-op (status 0) when none runs.
serve_stop() {
  local limit_s="${1:-15}" t0=$SECONDS rc=0
  [[ -n "$SERVE_PID" ]] || return 0
  kill -TERM "$SERVE_PID" 2>/dev/null || true
  while kill -0 "$SERVE_PID" 2>/dev/null && ((SECONDS - t0 < limit_s)); do sleep 0.05; done
  if kill -0 "$SERVE_PID" 2>/dev/null; then
    kill -KILL "$SERVE_PID" 2>/dev/null || true
    wait "$SERVE_PID" 2>/dev/null || true
    rc=124
  else
    wait "$SERVE_PID" || rc=$?
  fi
  SERVE_PID=""
  return "$rc"
}

# serve_kill: for an EXIT trap: kills a server still running (SIGKILL), without waiting long.
serve_kill() {
  if [[ -n "$SERVE_PID" ]] && kill -0 "$SERVE_PID" 2>/dev/null; then
    kill -KILL "$SERVE_PID" 2>/dev/null || true
    wait "$SERVE_PID" 2>/dev/null || true
  fi
  SERVE_PID=""
}

# http_get PATH [PORT]: the body of GET http://127.0.0.1:PORT/PATH (default port SERVE_PORT);
# empty output and status 1 when it does not answer 2xx within 5 s.
http_get() { curl -sf -m 5 "http://127.0.0.1:${2:-$SERVE_PORT}$1"; }

# jget JSON KEY | jget JSON FILTER: one value of a JSON document, as jq -r prints it (strings
# without quotes, null as "null"). KEY is a top-level key ("p99_frame_latency_ms"); a FILTER
# starts with a dot (".admission.limit"). Status 1 (and a message) when JSON does not parse.
jget() {
  if [[ "$2" == .* ]]; then
    jq -r "$2" <<<"$1"
  else
    jq -r --arg k "$2" '.[$k]' <<<"$1"
  fi
}
