#!/usr/bin/env bash
# 03_forecast: how well the online saturation forecast predicts when a full-KV pool runs dry.
#   bash experiments/eval/03_forecast.sh [--quick] [--bin PATH] [--out DIR]
# A fixed population of N full-KV sessions (static:N admission) grows the pool's occupancy
# linearly, rho(t) = rho0 + N r t, until the first frame starves. Per run it compares three
# times to saturation (clock time, s):
#   closed form  t_sat = pool / (N x KV bytes per second per session)
#                      = blocks x block_tokens x P / (N x (a + o)), from `sim --list-presets --json`
#                        (or the drive flags);
#   forecast     t_sat_predicted_s, the online forecast (kv::OccupancyForecast) made
#                t_sat_forecast_at_s, shortly after the population is complete;
#   observed     first_starved_at_s, the first frame handed back without a KV block.
# Rows: every simulator preset x N (virtual clock), plus the real CPU engine (drive, real time).
# Writes 03_forecast.{md,png,csv,seeds} into $OUT.
source "$(dirname "$0")/common.sh"
eval_init 03_forecast "$@"

csv="$OUT/03_forecast.csv"
echo "engine,preset,N,closed_s,forecast_s,forecast_at_s,observed_s,err_forecast_pct,err_closed_pct,duration_s" >"$csv"

# duration CLOSED: run length that clears the wall with margin.
duration_for() { awk -v t="$1" -v m="$DURATION_MARGIN" -v p="$DURATION_PAD_S" 'BEGIN { printf "%.0f", t * m + p + 0.5 }'; }

# add_row ENGINE PRESET N CLOSED DURATION SUMMARY_JSON: append a CSV row (errors vs observed, %).
add_row() {
  local engine="$1" preset="$2" n="$3" closed="$4" dur="$5" js="$6"
  local fc at obs
  fc="$(jget "$js" t_sat_predicted_s)"
  at="$(jget "$js" t_sat_forecast_at_s)"
  obs="$(jget "$js" first_starved_at_s)"
  awk -v e="$engine" -v p="$preset" -v n="$n" -v c="$closed" -v f="$fc" -v a="$at" -v o="$obs" \
    -v d="$dur" 'BEGIN {
      ok_o = (o != "" && o != "null"); ok_f = (f != "" && f != "null"); ok_a = (a != "" && a != "null")
      ef = (ok_o && ok_f) ? sprintf("%.2f", 100 * (f - o) / o) : ""
      ec = ok_o ? sprintf("%.2f", 100 * (c - o) / o) : ""
      printf "%s,%s,%s,%.3f,%s,%s,%s,%s,%s,%s\n", e, p, n, c, ok_f ? sprintf("%.3f", f) : "",
        ok_a ? sprintf("%.3f", a) : "", ok_o ? sprintf("%.3f", o) : "", ef, ec, d
    }' >>"$csv"
  if [ "$obs" = null ] || [ -z "$obs" ]; then
    progress "  WARNING: $preset N=$n never starved within ${dur} s"
  fi
}

# --- simulator: preset numbers from sim --list-presets --json ---------------------------------
for preset in $SIM_PRESETS; do
  # KV bytes/token cancels: pool bytes = blocks x bt x bytes/token.
  read -r period_ms a o blocks bt < <(jq -r \
    '"\(.period_ms) \(.tokens_per_frame) \(.output_tokens_per_frame) \(.pool_blocks) \(.block_tokens)"' \
    <<<"$(preset_json "$preset")")
  for n in $SIM_SESSIONS; do
    closed="$(awk -v b="$blocks" -v bt="$bt" -v p="$period_ms" -v n="$n" -v a="$a" -v o="$o" \
      'BEGIN { printf "%.3f", b * bt * (p / 1000) / (n * (a + o)) }')"
    dur="$(duration_for "$closed")"
    progress "sim $preset N=$n: closed form ${closed} s, running ${dur} s"
    record_seed "sim:$preset:N=$n" "$SEED"
    js="$(summary sim --preset "$preset" --sessions "$n" --kv full --admission "static:$n" \
      --duration "$dur" --seed "$SEED")"
    add_row sim "$preset" "$n" "$closed" "$dur" "$js"
  done
done

# --- real CPU engine (real time) -----------------------------------------------------------
for row in $DRIVE_ROWS; do
  n="${row%%:*}"
  blocks="${row##*:}"
  closed="$(awk -v b="$blocks" -v bt="$DRIVE_BLOCK_TOKENS" -v p="$DRIVE_PERIOD_MS" -v n="$n" \
    -v a="$DRIVE_TOKENS_PER_FRAME" -v o="$DRIVE_OUTPUT_TOKENS_PER_FRAME" \
    'BEGIN { printf "%.3f", b * bt * (p / 1000) / (n * (a + o)) }')"
  dur="$(duration_for "$closed")"
  progress "drive $DRIVE_MODEL N=$n blocks=$blocks: closed form ${closed} s, running ${dur} s (real time)"
  record_seed "drive:$DRIVE_MODEL:N=$n" "$SEED"
  js="$(summary drive --model "$DRIVE_MODEL" --sessions "$n" --kv full --admission "static:$n" \
    --kv-blocks "$blocks" --block-tokens "$DRIVE_BLOCK_TOKENS" --period-ms "$DRIVE_PERIOD_MS" \
    --tokens-per-frame "$DRIVE_TOKENS_PER_FRAME" \
    --output-tokens-per-frame "$DRIVE_OUTPUT_TOKENS_PER_FRAME" --threads "$DRIVE_THREADS" \
    --duration "$dur" --seed "$SEED")"
  add_row drive "cpu/$DRIVE_MODEL" "$n" "$closed" "$dur" "$js"
done

# --- table ----------------------------------------------------------------------------------
progress "table and plot"
{
  echo "| engine | preset | N | closed-form t_sat | forecast t_sat (made at) | observed first starved | forecast vs observed | closed form vs observed |"
  echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  tail -n +2 "$csv" | awk -F, '
    function s(x) { return x == "" ? "-" : sprintf("%.1f s", x) }
    function pc(x) { return x == "" ? "-" : sprintf("%+.1f%%", x) }
    { printf "| %s | %s | %s | %s | %s (at %s) | %s | %s | %s |\n", $1, $2, $3, s($4), s($5),
        s($6), ($7 == "" ? "not within " $10 " s" : s($7)), pc($8), pc($9) }'
  echo
  echo "Mean |error| vs observed, per preset:"
  echo
  echo "| preset | runs | forecast | closed form |"
  echo "| --- | ---: | ---: | ---: |"
  tail -n +2 "$csv" | awk -F, '
    { if (!($2 in k)) { order[++m] = $2; k[$2] = 1 }
      if ($8 != "") { nf[$2]++; sf[$2] += ($8 < 0 ? -$8 : $8) }
      if ($9 != "") { nc[$2]++; sc[$2] += ($9 < 0 ? -$9 : $9) }
      runs[$2]++ }
    END { for (i = 1; i <= m; i++) { p = order[i]
      printf "| %s | %d | %s | %s |\n", p, runs[p],
        (nf[p] ? sprintf("%.1f%%", sf[p] / nf[p]) : "-"), (nc[p] ? sprintf("%.1f%%", sc[p] / nc[p]) : "-") } }'
  echo
  echo "Full KV, static:N admission, seed $SEED. Closed form: pool / (N x KV bytes per second) ="
  echo "blocks x block tokens x P / (N x (a + o)); forecast: t_sat_predicted_s (kv::OccupancyForecast,"
  echo "least squares over the last 30 s, made at the time in brackets); observed: first_starved_at_s."
  echo "Errors are signed, (t - observed) / observed. sim: virtual clock and cost model; drive: the"
  echo "CPU engine ($DRIVE_MODEL, $DRIVE_THREADS thread, P = $DRIVE_PERIOD_MS ms, a = $DRIVE_TOKENS_PER_FRAME, o = $DRIVE_OUTPUT_TOKENS_PER_FRAME) in real time."
} >"$OUT/03_forecast.md"

# --- plot: forecast (filled) and closed form (open) vs observed, log-log --------------------
groups="$(tail -n +2 "$csv" | cut -d, -f2 | awk '!seen[$0]++' | tr '\n' ' ')"
plot "
set terminal pngcairo size 1400,650 font 'DejaVu Sans,11' linewidth 1.5
set output '$OUT/03_forecast.png'
array C[6] = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b']
groups = '$groups'
ng = words(groups)
grp(i) = word(groups, i)
set multiplot layout 1,2 title 'Saturation forecast vs observed first starved frame (full KV, static:N)'
set title 'predicted vs observed (filled: online forecast, open: closed form)'
set xlabel 'observed first starved frame (s)'
set ylabel 'predicted t_{sat} (s)'
set logscale xy
set xrange [5:3000]
set yrange [5:3000]
set grid xtics ytics lc rgb '#dddddd'
set key top left font ',10'
set samples 200
plot '+' using 1:(0.9*\$1):(1.1*\$1) with filledcurves lc rgb '#e8e8e8' title '±10%', \\
     x with lines lc rgb '#777777' dt 2 title 'y = x', \\
     for [i=1:ng] '$csv' skip 1 using (strcol(2) eq grp(i) ? \$7 : 1/0):5 with points pt 7 ps 1.4 lc rgb C[i] title grp(i), \\
     for [i=1:ng] '$csv' skip 1 using (strcol(2) eq grp(i) ? \$7 : 1/0):4 with points pt 4 ps 1.6 lc rgb C[i] notitle
set title 'error vs observed (%), filled: forecast, open: closed form'
unset logscale y
set yrange [-20:20]
set ylabel 'error (%)'
set key top right font ',10'
plot '+' using 1:(-10):(10) with filledcurves lc rgb '#e8e8e8' title '±10%', \\
     0 with lines lc rgb '#777777' dt 2 notitle, \\
     for [i=1:ng] '$csv' skip 1 using (strcol(2) eq grp(i) ? \$7 : 1/0):8 with points pt 7 ps 1.4 lc rgb C[i] notitle, \\
     for [i=1:ng] '$csv' skip 1 using (strcol(2) eq grp(i) ? \$7 : 1/0):9 with points pt 4 ps 1.6 lc rgb C[i] notitle
unset multiplot
"
finish
