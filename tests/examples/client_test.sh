#!/usr/bin/env bash
# examples/client.py against a live server: `metronome serve --model synthetic:tiny` on a free
# loopback port, the client's session of 5 frames, its output checked line by line, then a clean
# shutdown. Skips (77) when python3 has no `websockets`, except under CI=true, where that is a
# failure (scripts/setup.sh installs python3-websockets).
# Usage: client_test.sh METRONOME_BINARY
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
source "$root/scripts/lib.sh"
# Debian's python3 has the package; a python3 earlier on PATH (pyenv, a venv) may not.
python=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import websockets' 2>/dev/null; then python="$p"; break; fi
done
if [[ -z "$python" ]]; then
  echo "python3 has no websockets module (run scripts/setup.sh)"
  [[ "${CI:-}" == true ]] && exit 1
  exit 77
fi

work="$(mktemp -d)"
trap 'serve_kill; rm -rf "$work"' EXIT
serve_start "$1" "$work/serve" --model synthetic:tiny --host 127.0.0.1 --port 0 --threads 1
out="$("$python" "$root/examples/client.py" "ws://127.0.0.1:$SERVE_PORT/v1/realtime" 5)"
echo "$out"
fail() { echo "FAIL: $1" >&2; exit 1; }
grep -qE '^session [0-9]+ started, kv window$' <<<"$out" || fail "no session.started line"
[[ "$(grep -cE '^frame [0-4]: (ok|late), ids \[[0-9]+\], [0-9.]+ ms$' <<<"$out")" == 5 ]] ||
  fail "expected 5 frame lines with an outcome and one output id each"
grep -qE '^session [0-9]+ ended: client, 5 frames$' <<<"$out" || fail "no session.ended line"
serve_stop || fail "serve did not exit cleanly on SIGTERM"
echo "PASS"
