# Shared by the evaluation scripts (sourced, not run). Each experiment script:
#   source "$(dirname "$0")/common.sh"; eval_init NN_name "$@"
# then reads its config (NN_name.conf, QUICK=1 selects the quick values), runs, and writes into
# $OUT: NN_name.md (its table, markdown), NN_name.png (its plot), NN_name.seeds (the seeds used),
# plus any raw data (CSV) it plotted from.
#
# Flags every experiment takes: --quick (the CI-sized run), --bin PATH (the metronome binary;
# default build/release/apps/metronome), --out DIR (default build/eval/{quick,full}), --resume
# (keep the runs an earlier invocation left in DIR and run only the missing ones: for adding a
# preset or seeds to a long experiment; the tables and plots are always rebuilt).
set -euo pipefail

eval_init() {
  NAME="$1"
  shift
  QUICK=0
  RESUME=0
  BIN="${METRONOME_BIN:-build/release/apps/metronome}"
  OUT=""
  while (($# > 0)); do
    case "$1" in
      --quick) QUICK=1; shift ;;
      --bin) BIN="$2"; shift 2 ;;
      --out) OUT="$2"; shift 2 ;;
      --resume) RESUME=1; shift ;;
      *) echo "$NAME: unknown argument '$1' (--quick, --bin PATH, --out DIR, --resume)" >&2; exit 2 ;;
    esac
  done
  if [ -z "$OUT" ]; then
    if [ "$QUICK" = 1 ]; then OUT=build/eval/quick; else OUT=build/eval/full; fi
  fi
  mkdir -p "$OUT"
  if [ ! -x "$BIN" ]; then
    echo "$NAME: no metronome binary at '$BIN' (build it, or pass --bin)" >&2
    exit 2
  fi
  EVAL_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  # shellcheck source=/dev/null
  source "$EVAL_DIR/$NAME.conf"
  : >"$OUT/$NAME.seeds"
  START_S=$SECONDS
}

# progress MESSAGE: one line on stderr with the experiment's name and elapsed time.
progress() { printf '[%s %4ds] %s\n' "$NAME" "$((SECONDS - START_S))" "$*" >&2; }

# record_seed WHAT SEED: the seeds file lists every seed a run used.
record_seed() { printf '%s %s\n' "$1" "$2" >>"$OUT/$NAME.seeds"; }

# jget JSON KEY: a top-level value of a one-line JSON object (numbers, null, true/false, strings
# without commas).
jget() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -n 1 | cut -d: -f2- | tr -d '"'; }

# preset_shape PRESET: "period_ms tokens_per_frame window" of a simulator preset (tokens per frame
# = a + o), read from `metronome sim --list-presets`.
preset_shape() {
  "$BIN" sim --list-presets | awk -v p="$1:" '
    $1 == p { f = 1; next }
    f && /period/ { split($4, a, "="); split($5, o, "="); per = $2; tok = a[2] + o[2] }
    f && /default window/ { split($NF, w, "="); split($(NF - 1), w, "="); print per, tok, w[2]; exit }'
}

# have FILE...: with --resume, whether every FILE was left non-empty by an earlier run.
have() {
  local f
  if [ "$RESUME" != 1 ]; then return 1; fi
  for f in "$@"; do [ -s "$f" ] || return 1; done
}

# summary ARGS...: run metronome with --summary-json and print the summary line.
summary() { "$BIN" "$@" --summary-json --quiet | tail -n 1; }

# plot SCRIPT: run gnuplot on SCRIPT (a here-doc) with the house style; the script sets its own
# output file and plot commands.
plot() {
  gnuplot <<GNUPLOT
set terminal pngcairo size 1100,650 font "DejaVu Sans,11" linewidth 1.5
set border 3 lc rgb "#555555"
set tics nomirror textcolor rgb "#333333"
set grid ytics lc rgb "#dddddd" lw 1
set key top left box lc rgb "#cccccc" opaque
set datafile separator ","
set datafile missing ""
$1
GNUPLOT
}

# finish: check the experiment produced its table and plot.
finish() {
  local f
  for f in "$OUT/$NAME.md" "$OUT/$NAME.png"; do
    if [ ! -s "$f" ]; then
      echo "$NAME: $f was not produced" >&2
      exit 1
    fi
  done
  progress "done: $OUT/$NAME.md, $OUT/$NAME.png"
}

# serve_start [serve flags...]: `metronome serve --model synthetic:tiny` on a free loopback port,
# one engine thread; sets SERVE_PID and SERVE_URL (ws://127.0.0.1:PORT). The server is stopped on
# exit if the experiment has not stopped it (serve_stop).
SERVE_PID=""
serve_start() {
  local log="$OUT/$NAME.serve.log" port="" _
  "$BIN" serve --model synthetic:tiny --port 0 --threads 1 --quiet "$@" >"$log" 2>&1 &
  SERVE_PID=$!
  trap 'if [ -n "$SERVE_PID" ]; then kill "$SERVE_PID" 2>/dev/null || true; fi' EXIT
  for _ in $(seq 1 300); do
    port="$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
    if [ -n "$port" ]; then
      SERVE_URL="ws://127.0.0.1:$port"
      return 0
    fi
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "$NAME: serve did not start:" >&2
  cat "$log" >&2
  exit 1
}

# serve_stop: SIGTERM (drain and close), and fail if the server did not exit cleanly.
serve_stop() {
  kill -TERM "$SERVE_PID"
  if ! wait "$SERVE_PID"; then
    echo "$NAME: serve exited with status $? on SIGTERM (log: $OUT/$NAME.serve.log)" >&2
    exit 1
  fi
  SERVE_PID=""
}
