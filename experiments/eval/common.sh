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
# serve_start, serve_stop, serve_kill, http_get, jget (jq).
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

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
  trap serve_kill EXIT  # a server an experiment started and did not stop (tiny_serve)
}

# progress MESSAGE: one line on stderr with the experiment's name and elapsed time.
progress() { printf '[%s %4ds] %s\n' "$NAME" "$((SECONDS - START_S))" "$*" >&2; }

# record_seed WHAT SEED: the seeds file lists every seed a run used.
record_seed() { printf '%s %s\n' "$1" "$2" >>"$OUT/$NAME.seeds"; }

# preset_json PRESET: the preset's object from `metronome sim --list-presets --json` (name,
# period_ms, tokens_per_frame, output_tokens_per_frame, window, sinks, pool_blocks, block_tokens,
# aimd_window_s, ...); exits naming the preset when there is no such preset.
preset_json() {
  local j
  j="$("$BIN" sim --list-presets --json | jq -c --arg p "$1" '.presets[] | select(.name == $p)')"
  if [ -z "$j" ]; then
    echo "$NAME: preset '$1' not in 'metronome sim --list-presets'" >&2
    exit 2
  fi
  echo "$j"
}

# preset_shape PRESET: "period_ms tokens_per_frame window" of a simulator preset (tokens per frame
# = a + o).
preset_shape() {
  jq -r '"\(.period_ms) \(.tokens_per_frame + .output_tokens_per_frame) \(.window)"' \
    <<<"$(preset_json "$1")"
}

# have FILE...: with --resume, whether every FILE was left non-empty by an earlier run.
have() {
  local f
  if [ "$RESUME" != 1 ]; then return 1; fi
  for f in "$@"; do [ -s "$f" ] || return 1; done
}

# summary ARGS...: run metronome with --summary-json and print the summary line.
summary() { "$BIN" "$@" --summary-json --quiet | tail -n 1; }

# run_label PRESET: how tables and plots name a run's system; the pseudo-preset "cpu" is the real
# engine (drive on the real clock: synthetic:tiny, or the experiment's CPU_MODEL), the others are
# simulator presets.
run_label() {
  if [ "$1" = cpu ]; then echo "${CPU_MODEL:-synthetic:tiny}, CPU engine (drive)"; else echo "$1"; fi
}

# engine_kv_args KV WINDOW: the real engine's KV flags (the global array KV_ARGS). Window KV:
# W = WINDOW + 4 sinks, absolute positions (what the published CPU rows measured; the serving
# default, rolling, rotates each query for the sinks, which makes synthetic:tiny's heavy frames
# ~1.8x slower). Full KV: past the synthetic model's trained context (4096 tokens) a session would
# be ended with an error; in these experiments it must keep growing.
engine_kv_args() {
  if [ "$1" = window ]; then KV_ARGS=(--window "$2" --sinks 4 --positions absolute); else KV_ARGS=(--max-context 1000000); fi
}

# meets_deadline SUMMARY_JSON: p99 frame latency <= 0.85 D and no starved frame (N_true's test).
meets_deadline() {
  awk -v p="$(jget "$1" p99_frame_latency_ms)" -v d="$(jget "$1" deadline_ms)" \
    -v s="$(jget "$1" starved_frames)" 'BEGIN { exit (p <= 0.85 * d && s == 0) ? 0 : 1 }'
}

# engine_window_ok SECONDS DRIVE_ARGS... N: N window sessions on the real engine (DRIVE_ARGS: the
# drive command with its model, frame shape and window) meet the deadline for SECONDS, on a pool
# that never binds. N comes last, as largest_passing passes it.
engine_window_ok() {
  local seconds="$1" n="${!#}"
  shift
  meets_deadline "$(summary "${@:1:$#-1}" --sessions "$n" --kv window --admission "static:$n" \
    --kv-blocks $((40 * n + 64)) --duration "$seconds")"
}

# cpu_drive_args: the pseudo-preset "cpu"'s drive command (the global array CPU_ARGS): the real
# engine, synthetic:tiny on one thread and the real clock, frames of the experiment's
# CPU_TOKENS_IN in + CPU_TOKENS_OUT out every CPU_PERIOD_MS.
cpu_drive_args() {
  CPU_ARGS=(drive --model synthetic:tiny --threads 1 --period-ms "$CPU_PERIOD_MS"
    --tokens-per-frame "$CPU_TOKENS_IN" --output-tokens-per-frame "$CPU_TOKENS_OUT")
}

# cpu_window_ok SECONDS N: N window sessions (W = CPU_WINDOW + 4 sinks) of the pseudo-preset "cpu"
# meet the deadline for SECONDS (seed SEED) on a pool that never binds: N_true's test there.
cpu_window_ok() {
  cpu_drive_args
  engine_kv_args window "$CPU_WINDOW"
  engine_window_ok "$1" "${CPU_ARGS[@]}" --seed "$SEED" "${KV_ARGS[@]}" "$2"
}

# load_average: the 1-minute load average now (what shared the cores with a CPU-engine run).
load_average() { cut -d' ' -f1 /proc/loadavg; }

# probe_seconds PERIOD_MS TOKENS_PER_FRAME WINDOW MIN_S FILLS: how long an N_true probe runs: 30
# periods, FILLS window fills, at least MIN_S.
probe_seconds() {
  awk -v p="$1" -v t="$2" -v w="$3" -v m="$4" -v k="$5" 'BEGIN { r = p * 30 / 1000;
    f = k * w / (t * 1000 / p); if (f > r) r = f; if (r < m) r = m; printf "%d", r }'
}

# largest_passing LABEL START TOLERANCE PREDICATE ARGS...: the largest N >= 1 for which
# `PREDICATE ARGS... N` succeeds (it must succeed for every smaller N): doubling from START, then
# bisection until the bracket [lo, hi) is at most TOLERANCE wide, with a progress line per probe.
# Sets LARGEST (1 when even START fails and nothing smaller was tried).
largest_passing() {
  local label="$1" lo=1 hi="$2" tolerance="$3" mid
  shift 3
  while "$@" "$hi"; do lo=$hi; hi=$((hi * 2)); done
  while ((hi - lo > tolerance)); do
    mid=$(((lo + hi) / 2))
    if "$@" "$mid"; then lo=$mid; else hi=$mid; fi
    progress "$label: N_true in [$lo, $hi)"
  done
  LARGEST=$lo
}

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

# time_panel TITLE ITEM...: one panel of a multiplot_png figure, sessions over time, plotting the
# gnuplot plot items ITEM... (e.g. "'run.csv' every ::1 using 1:3 with lines title 'limit'").
time_panel() {
  local title="$1"
  shift
  printf "\nset title '%s'\nset xlabel 'time (s)'; set ylabel 'sessions'; set yrange [0:*]; set xrange [0:*]\nplot %s\n" \
    "$title" "$(printf '%s, ' "$@" | sed 's/, $//')"
}

# multiplot_png PNG WIDTH HEIGHT ROWS COLS KEY_ROWS TITLE PANELS: PANELS (time_panel output,
# concatenated) as one ROWS x COLS figure of WIDTH x HEIGHT pixels titled TITLE, each panel's key
# below it in at most KEY_ROWS rows.
multiplot_png() {
  plot "
set output '$1'
set terminal pngcairo size $2,$3 font 'DejaVu Sans,11' linewidth 1.5 noenhanced
set key below horizontal maxrows $6 box lc rgb '#cccccc' font ',9'
set multiplot layout $4,$5 title '$7' font ',13'
$8
unset multiplot
"
}

# pct A B: A as a percentage of B ("12.50%"), "-" when B is 0.
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f%%", 100 * a / b; else print "-" }'; }

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

# tiny_serve [serve flags...]: `metronome serve --model synthetic:tiny` on a free loopback port,
# one engine thread (serve_start of scripts/lib.sh: sets SERVE_PID and SERVE_PORT; here also
# SERVE_URL, ws://127.0.0.1:PORT); its output in $OUT/$NAME.serve.{out,err}. Exits the experiment
# when it does not start. Killed on exit if the experiment has not stopped it (tiny_serve_stop).
tiny_serve() {
  serve_start "$BIN" "$OUT/$NAME.serve" --model synthetic:tiny --port 0 --threads 1 --quiet "$@" ||
    exit 1
  SERVE_URL="ws://127.0.0.1:$SERVE_PORT"
}

# tiny_serve_stop: SIGTERM (drain and close), and fail if the server did not exit cleanly.
tiny_serve_stop() {
  local rc=0
  serve_stop || rc=$?
  if ((rc != 0)); then
    echo "$NAME: serve exited with status $rc on SIGTERM (log: $OUT/$NAME.serve.err)" >&2
    exit 1
  fi
}
