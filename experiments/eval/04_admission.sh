#!/usr/bin/env bash
# Experiment 04, admission: where controllers settle under arrivals well above capacity. N_true is
# measured first (bisection over fixed window-KV populations: the largest N with p99 <= 0.85 D and
# no starved frame). Expected (the paper: N* ~209 on one GPU with the bound): AIMD on the bounded
# (window) system converges to N* just under N_true with no starving; on full KV, where latency is
# flat until the pool runs dry, it over-admits into the KV wall; the KV look-ahead guard
# (--kv-guard) holds it back. static:N_true, memory admission and a dead-band-free AIMD for
# comparison.
source "$(dirname "$0")/common.sh"
eval_init 04_admission "$@"
record_seed "sim (all runs)" "$SEED"

# The pseudo-preset "cpu" is the real engine (drive synthetic:tiny, one thread, the real clock)
# with heavy frames (CPU_TOKENS_IN in, CPU_TOKENS_OUT out per CPU_PERIOD_MS) so that the deadline
# binds at a few dozen sessions; the others are simulator presets.
cpu_drive_args

# p99_ok PRESET RUN_S N: N window sessions keep p99 <= 0.85 D with no starved frame (the CPU
# engine on a pool that never binds).
p99_ok() {
  if [ "$1" = cpu ]; then
    cpu_window_ok "$2" "$3"
  else
    meets_deadline "$(summary sim --preset "$1" --sessions "$3" --kv window \
      --admission "static:$3" --duration "$2" --seed "$SEED")"
  fi
}

# The runs: controller label, KV policy, admission flags.
RUNS=(
  "static window"
  "memory window"
  "aimd window"
  "aimd-nodeadband window"
  "aimd+guard window"
  "aimd full"
  "aimd+guard full"
)

if [[ " $PRESETS " == *" cpu "* ]]; then read -r -a CPU_RUN_LIST <<<"$CPU_RUNS"; fi
# runs_of PRESET: the runs (indices into RUNS) for a preset.
runs_of() {
  local i
  for i in "${!RUNS[@]}"; do
    if [ "$1" != cpu ] || [[ " ${CPU_RUN_LIST[*]} " == *" ${RUNS[$i]// /:} "* ]]; then echo "$i"; fi
  done
}

: >"$OUT/04_ntrue.csv"
for preset in $PRESETS; do
  if [ "$preset" = cpu ]; then
    period=$CPU_PERIOD_MS
    probe_s=$CPU_PROBE_S
    lifetime_s=$CPU_LIFETIME_S
  else
    read -r period per_frame window < <(preset_shape "$preset")
    probe_s=$(probe_seconds "$period" "$per_frame" "$window" "$MIN_PROBE_S" "$PROBE_FILLS")
    lifetime_s=${LIFETIME_OF[$preset]:-$LIFETIME_S}
  fi
  if have "$OUT/04_ntrue_$preset.txt"; then
    n_true=$(cat "$OUT/04_ntrue_$preset.txt")
    progress "$preset: N_true = $n_true (kept from an earlier run)"
  else
    progress "$preset: N_true by bisection (${probe_s} s per probe)"
    largest_passing "$preset" 32 1 p99_ok "$preset" "$probe_s"
    n_true=$LARGEST
    echo "$n_true" >"$OUT/04_ntrue_$preset.txt"
  fi
  # AIMD runs use the binary's default control window for the period (the rule lives in C++);
  # the simulator presets list it, and a run's summary reports the one it used (aimd_window_s).
  initial=$AIMD_INITIAL
  if [ "$preset" = cpu ]; then
    run_s=$CPU_RUN_S
    initial=$CPU_AIMD_INITIAL
  else
    aimd_w=$(jget "$(preset_json "$preset")" aimd_window_s)
    run_s=$(awk -v n="$n_true" -v w="$aimd_w" -v k="$RAMP_MULT" -v m="$MIN_RUN_S" \
      'BEGIN { r = k * n * w; if (r < m) r = m; printf "%d", r }')
  fi
  rate=$(awk -v n="$n_true" -v o="$OFFERED" -v l="$lifetime_s" 'BEGIN { printf "%.4f", o * n / l }')
  echo "$preset,$n_true,$probe_s,$run_s,$rate,$lifetime_s" >>"$OUT/04_ntrue.csv"
  progress "$preset: N_true = $n_true; arrivals poisson:$rate x exp:$lifetime_s s, ${run_s} s runs"

  for i in $(runs_of "$preset"); do
    read -r ctl kv <<<"${RUNS[$i]}"
    adm=()
    case "$ctl" in
      static) adm=(--admission "static:$n_true") ;;
      memory) adm=(--admission memory) ;;
      aimd) adm=(--admission aimd --no-kv-guard) ;;
      aimd-nodeadband) adm=(--admission aimd --no-kv-guard --aimd-low "$NARROW_LOW" --aimd-high 0.85) ;;
      aimd+guard) adm=(--admission aimd --kv-guard) ;;
    esac
    if [[ "$ctl" == aimd* ]]; then adm+=(--aimd-initial "$initial"); fi
    if have "$OUT/04_${preset}_${ctl}_$kv.json" "$OUT/04_${preset}_${ctl}_$kv.csv"; then continue; fi
    progress "$preset: $ctl, $kv KV"
    base=(sim --preset "$preset")
    if [ "$preset" = cpu ]; then
      engine_kv_args "$kv" "$CPU_WINDOW"
      base=("${CPU_ARGS[@]}" --kv-blocks "$CPU_BLOCKS" "${KV_ARGS[@]}")
    fi
    summary "${base[@]}" --seed "$SEED" --kv "$kv" "${adm[@]}" \
      --arrival "poisson:$rate" --session-duration "exp:$lifetime_s" --duration "$run_s" \
      --timeseries-out "$OUT/04_${preset}_${ctl}_$kv.csv" >"$OUT/04_${preset}_${ctl}_$kv.json"
  done
done

# limit_stats CSV RUN_S BAND COL: second-half mean, std, peak-to-trough of column COL (3: the
# limit; 2: active, for memory admission, which has no limit), and the settling time (the first
# sample from which it stays within +-BAND of that mean; "-" if it never does).
limit_stats() {
  awk -F, -v d="$2" -v b="$3" -v c="$4" 'NR > 1 { v = $c; t[n] = $1; l[n] = v; n++
      if ($1 >= d / 2) { s += v; q += v * v; m++; if (m == 1 || v > hi) hi = v; if (m == 1 || v < lo) lo = v } }
    END { mean = s / m; sd = q / m - mean * mean; sd = sd > 0 ? sqrt(sd) : 0
      settle = 0
      for (i = 0; i < n; i++) if (l[i] < (1 - b) * mean || l[i] > (1 + b) * mean) settle = (i + 1 < n) ? t[i + 1] : -1
      printf "%.1f %.1f %d %s\n", mean, sd, hi - lo, settle < 0 ? "-" : sprintf("%.0f", settle) }' "$1"
}
fmt() { if [ "$1" = null ] || [ -z "$1" ]; then echo "-"; else printf '%.1f' "$1"; fi; }

: >"$OUT/04_data.csv"
{
  echo "N_true: the largest fixed window-KV population with p99 <= 0.85 D and no starved frame (bisection, the preset's pool; the CPU engine's on a pool that never binds). Arrivals: poisson at $OFFERED x N_true / L, lifetimes exp:L (L per run below: $LIFETIME_S s in the simulator unless the preset's windows take longer to fill, $CPU_LIFETIME_S s on the CPU engine; offered load ~$OFFERED x N_true). AIMD: the binary's defaults (slow start, headroom-scaled growth, windows that close on enough frames, at most the longest window listed per preset below), start at $AIMD_INITIAL ($CPU_AIMD_INITIAL on the CPU engine); no dead band = grow below $NARROW_LOW D, cut above 0.85 D. N* = the limit's mean over the second half; settling: the limit stays within +-$(awk -v b="$SETTLE_BAND" 'BEGIN { print 100 * b }')% of N* from then on; oscillation: the limit's std / peak-to-trough over the second half. memory admission has no limit: its row reports the active sessions instead. With the KV guard on full KV the guard, not the limit, binds (active < limit), so the sessions held are the active column."
  echo
  while IFS=, read -r preset n_true probe_s run_s rate lifetime_s; do
    aimd_w=$(jget "$(cat "$OUT/04_${preset}_aimd_window.json")" aimd_window_s)
    pool=""
    if [ "$preset" = cpu ]; then
      pool=" Frames of $CPU_TOKENS_IN tokens in + $CPU_TOKENS_OUT out every $CPU_PERIOD_MS ms, a $CPU_BLOCKS-block pool (16 tokens a block), window W = $CPU_WINDOW + 4 sinks."
    fi
    echo "**$(run_label "$preset")**: N_true = $n_true (${probe_s} s probes); arrivals poisson:$rate/s x exp:$lifetime_s s, ${run_s} s runs, AIMD window ${aimd_w} s.$pool"
    echo
    echo "| controller | KV | N* | N* / N_true | active mean (2nd half) | settling (s) | peak active / N_true | limit std / peak-to-trough | admitted | rejected | abandoned | late | starved | mute alarms | p99 (ms) |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for i in $(runs_of "$preset"); do
      read -r ctl kv <<<"${RUNS[$i]}"
      j="$(cat "$OUT/04_${preset}_${ctl}_$kv.json")"
      nstar="$(jget "$j" limit_mean_second_half)"
      col=3
      if [ "$nstar" = null ]; then nstar="$(jget "$j" active_mean_second_half)"; col=2; fi
      read -r mean sd ptt settle < <(limit_stats "$OUT/04_${preset}_${ctl}_$kv.csv" "$run_s" "$SETTLE_BAND" "$col")
      mark=""
      if ((col == 2)); then mark=" (no limit: active)"; fi
      peak="$(jget "$j" active_peak)"
      frames="$(jget "$j" frames)"
      echo "$preset,$ctl,$kv,$n_true,$mean,$sd,$ptt,$settle,$peak,$(jget "$j" rejected),$(jget "$j" late_frames),$(jget "$j" starved_frames),$frames,$(jget "$j" mute_alarms)" >>"$OUT/04_data.csv"
      printf '| %s | %s | %s | %.2f | %s | %s | %.2f | %s / %s | %s | %s | %s | %s | %s | %s | %s |\n' \
        "$ctl" "$kv" "$(fmt "$nstar")$mark" "$(awk -v a="$nstar" -v b="$n_true" 'BEGIN { print a / b }')" \
        "$(fmt "$(jget "$j" active_mean_second_half)")" "$settle" \
        "$(awk -v a="$peak" -v b="$n_true" 'BEGIN { print a / b }')" "$sd" "$ptt" \
        "$(jget "$j" admitted)" "$(jget "$j" rejected)" "$(jget "$j" abandoned)" \
        "$(pct "$(jget "$j" late_frames)" "$frames")" "$(pct "$(jget "$j" starved_frames)" "$frames")" \
        "$(jget "$j" mute_alarms)" "$(fmt "$(jget "$j" p99_frame_latency_ms)")"
    done
    echo
  done <"$OUT/04_ntrue.csv"
} >"$OUT/04_admission.md"

# One panel per preset: limit (solid) and active (thin) over time, AIMD on window KV vs AIMD on
# full KV vs AIMD + guard on full KV, with N_true.
# One panel per preset: limit (thick) and active sessions (thin) over time for AIMD on window KV,
# AIMD + guard on window KV (where it ran), AIMD and AIMD + guard on full KV, with N_true.
npresets=$(wc -l <"$OUT/04_ntrue.csv")
cols=$((npresets < 3 ? npresets : 3))
rows=$(((npresets + cols - 1) / cols))
panels=""
while IFS=, read -r preset n_true _ _ _ _; do
  f="$OUT/04_$preset"
  lines=()
  add_line() { # RUN COLOUR_LIMIT COLOUR_ACTIVE TITLE
    [ -s "${f}_$1.csv" ] || return 0
    lines+=("'${f}_$1.csv' every ::1 using 1:3 with lines lw 2 lc rgb '$2' title '$4: limit'"
      "'${f}_$1.csv' every ::1 using 1:2 with lines lw 0.7 lc rgb '$3' title '... active'")
  }
  add_line aimd_window '#2471a3' '#7fb3d5' 'AIMD, window KV'
  add_line aimd+guard_window '#8e44ad' '#c39bd3' 'AIMD + KV guard, window KV'
  add_line aimd_full '#c0392b' '#f1948a' 'AIMD, full KV'
  add_line aimd+guard_full '#1e8449' '#82e0aa' 'AIMD + KV guard, full KV'
  lines+=("$n_true with lines dt 2 lw 1.5 lc rgb '#555555' title 'N_true'")
  panels+="$(time_panel "$(run_label "$preset") (N_true = $n_true)" "${lines[@]}")"
done <"$OUT/04_ntrue.csv"
multiplot_png "$OUT/04_admission.png" $((640 * cols + 100)) $((560 * rows + 60)) "$rows" "$cols" 4 \
  "AIMD admission under arrivals at ~${OFFERED}x N_true: window KV vs full KV" "$panels"
finish
