#!/usr/bin/env bash
# Experiment 08, convergence (issue 13): every admission controller from initial limit 1 under
# a crowd far above capacity, window KV, on every simulator preset. Measured per run: the time
# the limit first reaches 0.9 N_true, the settled ratio (the limit's mean over the last part of
# the run / N_true) and its oscillation there (std / mean, peak-to-trough / mean). Expected: the
# new AIMD (slow start, headroom-scaled growth, frame-closed windows) reaches 0.9 N_true within
# 60 s on moshi-7b and within 150 periods on the 1-2 s-period presets, settles in [0.9, 1.0]
# N_true and oscillates by at most 10%, there and on the real CPU engine (pseudo-preset "cpu",
# experiment 04's shape, real clock, machine load recorded); the old fixed +1 AIMD (one session
# per 25-period window) takes ~N_true windows; gradient2 is the peer baseline; static:N_true and
# memory for reference.
source "$(dirname "$0")/common.sh"
eval_init 08_convergence "$@"
record_seed "sim (all runs)" "$SEED"

if [ -z "$PRESETS" ]; then
  # The GPU presets: a -cpu preset's sessions do not fit its own engine (results.md, 10).
  PRESETS="$("$BIN" sim --list-presets --json |
    jq -r '.presets[].name | select(endswith("-cpu") | not)' | tr '\n' ' ')"
fi
if [ "$CPU" = 1 ] && [[ " $PRESETS " != *" cpu "* ]]; then PRESETS="$PRESETS cpu"; fi
cpu_drive_args

# The controllers: label and admission flags (N_TRUE is substituted per preset). "aimd-fixed" is
# the controller before issue 13: no slow start (factor 1), no headroom-scaled growth (gain 0),
# windows of a fixed length (no frame-count close), +1 per window.
CONTROLLERS=(
  "aimd-fixed|--admission aimd --no-kv-guard --aimd-initial 1 --aimd-slow-start 1 --aimd-headroom-gain 0 --aimd-window-frames 0 --aimd-step 1"
  "aimd|--admission aimd --no-kv-guard --aimd-initial 1"
  "aimd+guard|--admission aimd --aimd-initial 1 --kv-guard"
  "gradient2|--admission gradient2 --no-kv-guard --gradient2-initial 1"
  "static|--admission static:N_TRUE"
  "memory|--admission memory"
)

# p99_ok PRESET RUN_S N: N window sessions of PRESET keep p99 <= 0.85 D with no starved frame.
p99_ok() {
  if [ "$1" = cpu ]; then
    cpu_window_ok "$2" "$3"
  else
    meets_deadline "$(summary sim --preset "$1" --sessions "$3" --kv window --admission "static:$3" \
      --duration "$2" --seed "$SEED")"
  fi
}

# ran PRESET CONTROLLER: whether the controller runs on the preset (the CPU engine runs
# CPU_CONTROLLERS only).
ran() { [ "$1" != cpu ] || [[ " $CPU_CONTROLLERS " == *" $2 "* ]]; }

: >"$OUT/08_runs.csv"
for preset in $PRESETS; do
  if [ "$preset" = cpu ]; then
    period=$CPU_PERIOD_MS
  else
    read -r period per_frame window < <(preset_shape "$preset")
  fi
  if have "$OUT/08_ntrue_$preset.txt"; then
    n_true=$(cat "$OUT/08_ntrue_$preset.txt")
    progress "$preset: N_true = $n_true (kept from an earlier run)"
  else
    if [ -s "$OUT/04_ntrue_$preset.txt" ]; then
      n_true=$(cat "$OUT/04_ntrue_$preset.txt")
      progress "$preset: N_true = $n_true (experiment 04's bisection)"
    else
      start=32
      if [ "$preset" = cpu ]; then
        probe_s=$CPU_PROBE_S
        start=$CPU_BISECT_START
        load_average >"$OUT/08_cpu_load_ntrue.txt"
      else
        probe_s=$(probe_seconds "$period" "$per_frame" "$window" "$MIN_PROBE_S" "$PROBE_FILLS")
      fi
      progress "$preset: N_true by bisection (${probe_s} s per probe)"
      largest_passing "$preset" "$start" 1 p99_ok "$preset" "$probe_s"
      n_true=$LARGEST
    fi
    if [ "$preset" = cpu ] && ((CPU_CONFIRM_S > CPU_PROBE_S)); then
      # Short probes overestimate what the real engine sustains (its latency comes in episodes,
      # seconds apart): the bisection's N_true must also hold for CPU_CONFIRM_S, else it steps
      # down by 5% until it does.
      while ((n_true > 1)) && ! p99_ok "$preset" "$CPU_CONFIRM_S" "$n_true"; do
        progress "$preset: N_true = $n_true fails a ${CPU_CONFIRM_S} s probe"
        n_true=$(awk -v n="$n_true" 'BEGIN { m = int(0.95 * n); if (m >= n) m = n - 1; print m }')
      done
      progress "$preset: N_true = $n_true holds for ${CPU_CONFIRM_S} s"
    fi
    echo "$n_true" >"$OUT/08_ntrue_$preset.txt"
  fi
  crowd=$(awk -v n="$n_true" -v k="$CROWD_MULT" 'BEGIN { printf "%d", k * n + 0.5 }')
  base=(sim --preset "$preset")
  if [ "$preset" = cpu ]; then
    run_s=$CPU_RUN_S
    engine_kv_args window "$CPU_WINDOW"
    base=("${CPU_ARGS[@]}" --kv-blocks "$CPU_RUN_BLOCKS" "${KV_ARGS[@]}")
  else
    run_s=$(awk -v p="$period" -v t="$per_frame" -v w="$window" -v k="$RUN_PERIODS" -v f="$RUN_FILLS" \
      -v m="$MIN_RUN_S" 'BEGIN { r = p * k / 1000; fill = f * w * p / (1000 * t); if (fill > r) r = fill
        if (r < m) r = m; printf "%d", r }')
  fi
  progress "$preset: N_true = $n_true; a crowd of $crowd sessions from t = 0, ${run_s} s runs"
  for c in "${CONTROLLERS[@]}"; do
    ctl="${c%%|*}"
    read -r -a adm <<<"${c#*|}"
    adm=("${adm[@]//N_TRUE/$n_true}")
    ran "$preset" "$ctl" || continue
    f="$OUT/08_${preset}_$ctl"
    echo "$preset,$n_true,$period,$run_s,$ctl" >>"$OUT/08_runs.csv"
    if have "$f.json" "$f.csv"; then continue; fi
    progress "$preset: $ctl"
    if [ "$preset" = cpu ]; then load_average >"$f.load"; fi
    summary "${base[@]}" --seed "$SEED" --kv window "${adm[@]}" \
      --sessions "$crowd" --duration "$run_s" \
      --timeseries-out "$f.csv" >"$f.json"
  done
done

# convergence CSV N_TRUE RUN_S PART COL: "first_reach_s settled_ratio std_over_mean
# peak_to_trough_over_mean" of column COL (3: the limit; 2: active, for memory admission, which
# has no limit): the first time it reaches 0.9 N_true ("-" if never), its mean over the last PART
# of the run / N_true, and its spread there.
convergence() {
  awk -F, -v n="$2" -v d="$3" -v part="$4" -v c="$5" 'NR > 1 { v = $c
      if (reach == "" && v >= 0.9 * n) reach = $1
      if ($1 >= (1 - part) * d) { s += v; q += v * v; m++; if (m == 1 || v > hi) hi = v; if (m == 1 || v < lo) lo = v } }
    END { mean = s / m; sd = q / m - mean * mean; sd = sd > 0 ? sqrt(sd) : 0
      printf "%s %.3f %.3f %.3f\n", (reach == "" ? "-" : sprintf("%.0f", reach)), mean / n,
        (mean > 0 ? sd / mean : 0), (mean > 0 ? (hi - lo) / mean : 0) }' "$1"
}

: >"$OUT/08_data.csv"
{
  echo "From initial limit 1 (static: N_true; memory: no limit, its rows report active sessions), window KV at each preset's default window, a crowd of $CROWD_MULT x N_true sessions asking from t = 0 and retrying until admitted, each lasting the whole run, seed $SEED. N_true: the largest fixed window-KV population with p99 <= 0.85 D and no starved frame (experiment 04's bisection). **first 0.9 N_true**: the first time the limit reaches 0.9 N_true (the goal: ${GOAL_FAST_S} s on moshi-7b, ${GOAL_SLOW_S} s on the 1-2 s-period presets); **settled**: the limit's mean over the last $(awk -v p="$SETTLE_PART" 'BEGIN { print int(100 * p + 0.5) }')% of the run / N_true (goal [0.9, 1.0]); **oscillation**: its std / mean and peak-to-trough / mean there (goal <= 10%). aimd-fixed = the controller before issue 13 (\`--aimd-slow-start 1 --aimd-headroom-gain 0 --aimd-window-frames 0 --aimd-step 1\`: +1 per control window of 25 periods)."
  echo
  echo "| preset | N_true | run (s) | controller | first 0.9 N_true (s) | in periods | settled (limit / N_true) | std / mean | peak-to-trough / mean | admitted | rejected | starved | p99 / D |"
  echo "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  while IFS=, read -r preset n_true period run_s ctl; do
    f="$OUT/08_${preset}_$ctl"
    j="$(cat "$f.json")"
    col=3
    if [ "$(jget "$j" limit_mean_second_half)" = null ]; then col=2; fi
    read -r reach ratio sd ptt < <(convergence "$f.csv" "$n_true" "$run_s" "$SETTLE_PART" "$col")
    periods="-"
    if [ "$reach" != - ]; then periods=$(awk -v t="$reach" -v p="$period" 'BEGIN { printf "%.0f", 1000 * t / p }'); fi
    mark=""
    if ((col == 2)); then mark=" (active)"; fi
    echo "$preset,$ctl,$n_true,$reach,$ratio,$sd,$ptt" >>"$OUT/08_data.csv"
    label=$preset
    if [ "$preset" = cpu ]; then label="cpu (load $(cat "$f.load" 2>/dev/null || echo ?))"; fi
    printf '| %s | %s | %s | %s | %s | %s | %s%s | %.1f%% | %.1f%% | %s | %s | %s | %.2f |\n' \
      "$label" "$n_true" "$run_s" "$ctl" "${reach}" "$periods" "$ratio" "$mark" \
      "$(awk -v x="$sd" 'BEGIN { print 100 * x }')" "$(awk -v x="$ptt" 'BEGIN { print 100 * x }')" \
      "$(jget "$j" admitted)" "$(jget "$j" rejected)" \
      "$(pct "$(jget "$j" starved_frames)" "$(jget "$j" frames)")" \
      "$(awk -v a="$(jget "$j" p99_frame_latency_ms)" -v b="$(jget "$j" deadline_ms)" 'BEGIN { print a / b }')"
  done <"$OUT/08_runs.csv"
  echo
  if grep -q '^cpu,' "$OUT/08_runs.csv"; then
    echo "cpu: $(run_label cpu), frames of $CPU_TOKENS_IN tokens in + $CPU_TOKENS_OUT out every $CPU_PERIOD_MS ms, window W = $CPU_WINDOW + 4 sinks, a $CPU_RUN_BLOCKS-block pool (it holds the crowd: the KV guard never binds, so aimd+guard is aimd), ${CPU_PROBE_S} s N_true probes confirmed by a ${CPU_CONFIRM_S} s one (load average $(cat "$OUT/08_cpu_load_ntrue.txt" 2>/dev/null || echo "- (04's N_true)") at the bisection), real clock. The load average beside each run is the machine's 1-minute load when it started (2 cores here: above 2, other processes took the cores the engine shares). Only $CPU_CONTROLLERS run there."
    echo
  fi
} >"$OUT/08_convergence.md"

# One panel per preset: each controller's limit (memory: active sessions) over time, with N_true
# and 0.9 N_true.
presets_run=$(cut -d, -f1 "$OUT/08_runs.csv" | uniq)
npresets=$(wc -l <<<"$presets_run")
cols=$((npresets < 2 ? npresets : 2))
rows=$(((npresets + cols - 1) / cols))
declare -A COLOUR=([aimd-fixed]='#c0392b' [aimd]='#2471a3' [aimd+guard]='#17a589' [gradient2]='#8e44ad'
  [static]='#1e8449' [memory]='#b9770e')
panels=""
for preset in $presets_run; do
  n_true=$(awk -F, -v p="$preset" '$1 == p { print $2; exit }' "$OUT/08_runs.csv")
  lines=()
  for c in "${CONTROLLERS[@]}"; do
    ctl="${c%%|*}"
    ran "$preset" "$ctl" || continue
    col=3
    title="$ctl: limit"
    if [ "$ctl" = memory ]; then col=2; title="memory: active (no limit)"; fi
    dash=1
    if [ "$ctl" = aimd+guard ]; then dash=4; fi  # on top of aimd where the guard never binds
    lines+=("'$OUT/08_${preset}_$ctl.csv' every ::1 using 1:$col with lines lw 1.6 dt $dash lc rgb '${COLOUR[$ctl]}' title '$title'")
  done
  lines+=("$n_true with lines dt 2 lw 1.5 lc rgb '#555555' title 'N_true'"
    "0.9 * $n_true with lines dt 3 lw 1 lc rgb '#999999' title '0.9 N_true'")
  panels+="$(time_panel "$(run_label "$preset") (N_true = $n_true)" "${lines[@]}")"
done
multiplot_png "$OUT/08_convergence.png" $((700 * cols + 100)) $((520 * rows + 60)) "$rows" "$cols" 3 \
  "Admission limit from 1, a crowd of ${CROWD_MULT}x N_true, window KV" "$panels"
finish
