#!/usr/bin/env bash
# Experiment 06, quality: perplexity of long streams (STREAM_LEN tokens, several times the trained
# context) under full attention, window only, window + sinks, absolute vs rolling positions, for
# several W, on real pretrained models; per-position NLL across the trained context. Expected
# (StreamingLLM): full attention degrades once positions pass the trained context; a window
# without sinks degrades once it slides past the start; window + sinks with rolling positions
# stays flat. The streams are the models' own generations (no dataset here), see the conf.
source "$(dirname "$0")/common.sh"
eval_init 06_quality "$@"
RAW="$OUT/06_quality"
mkdir -p "$RAW"

# Placeholder table and plot when there is nothing to score.
skip_run() {
  progress "skipped: $1"
  {
    echo "**Skipped:** $1"
    echo
    echo "| model | stream | setting | ppl, all | ppl, within trained context | ppl, beyond trained context |"
    echo "| --- | --- | --- | ---: | ---: | ---: |"
    echo "| - | - | skipped: no model | - | - | - |"
  } >"$OUT/06_quality.md"
  plot "
set output '$OUT/06_quality.png'
set terminal pngcairo size 600,650 font 'DejaVu Sans,11' linewidth 1.5
unset border; unset tics; unset key; unset grid
set label 1 'experiment 06 skipped: $1' at graph 0.5, graph 0.5 center font ',14'
plot [0:1][0:1] 1/0 notitle
"
  finish
  exit 0
}

# The trained context of a model file: llama2.c header seq_len (7th int32), GGUF
# *.context_length (u32 after the key); 512 when neither can be read.
trained_ctx() {
  local f="$1" v="" off
  case "$f" in
    *.gguf)
      off="$(grep -boa 'context_length' "$f" | head -n 1 | cut -d: -f1 || true)"
      if [ -n "$off" ]; then v="$(od -An -t u4 -j $((off + 18)) -N 4 "$f" | tr -d ' ')"; fi ;;
    *) v="$(od -An -t d4 -j 24 -N 4 "$f" | tr -d ' ')" ;;
  esac
  if [[ "$v" =~ ^[0-9]+$ ]] && ((v > 0)); then echo "$v"; else echo 512; fi
}

# Resolve the models; skip the missing ones.
names=()
declare -A MPATH MTOK MCTX
for entry in $MODELS; do
  IFS='|' read -r path tok ctx <<<"$entry"
  if [ ! -f "$path" ]; then
    progress "model '$path' not found, skipped"
    continue
  fi
  if [ -n "$tok" ] && [ ! -f "$tok" ]; then
    progress "tokenizer '$tok' not found, model '$path' skipped"
    continue
  fi
  name="$(basename "$path")"
  [ -n "$ctx" ] || ctx="$(trained_ctx "$path")"
  names+=("$name")
  MPATH[$name]="$path"
  MTOK[$name]="$tok"
  MCTX[$name]="$ctx"
done
if ((${#names[@]} == 0)); then
  skip_run "none of the models is present (MODELS_DIR=$MODELS_DIR; bring your own with MODELS=\"path.gguf path.bin|tok.bin|ctx\")"
fi

model_args() {
  local n="$1"
  printf '%s\n' --model "${MPATH[$n]}"
  if [ -n "${MTOK[$n]}" ]; then printf '%s\n' --tokenizer "${MTOK[$n]}"; fi
}

# 1. The streams (ids files, BOS first, STREAM_LEN tokens).
# make_free MODEL FILE SETTING: SETTING is full or window:W:S:positions (the attention that
# writes the stream).
make_free() {
  local n="$1" f="$2" w s p
  local -a ma kv
  mapfile -t ma < <(model_args "$n")
  kv=(--kv full --max-context "$STREAM_LEN")
  if [ "$3" != full ]; then
    IFS=: read -r _ w s p <<<"$3"
    kv=(--kv window --window "$w" --sinks "$s" --positions "$p")
  fi
  "$BIN" generate "${ma[@]}" --prompt-ids 1 --steps $((STREAM_LEN - 1)) --temperature "$FREE_TEMP" \
    --top-p "$TOP_P" --seed "$SEED" "${kv[@]}" --threads "$THREADS" --print-ids 2>/dev/null |
    { printf '1 '; cat; } >"$f"
  record_seed "free stream ($3), $n" "$SEED"
}
make_turns() {
  local n="$1" f="$2" k=0 have=0 steps
  local -a ma
  mapfile -t ma < <(model_args "$n")
  local ctx="${MCTX[$n]}"
  steps="$TURN_MAX"
  if ((steps > ctx - 1)); then steps=$((ctx - 1)); fi
  : >"$f.tmp"
  while ((have < STREAM_LEN)); do
    k=$((k + 1))
    # One story: the ids up to (not including) the first BOS the model emits, then a BOS.
    "$BIN" generate "${ma[@]}" --prompt-ids 1 --steps "$steps" --temperature "$TURN_TEMP" \
      --top-p "$TOP_P" --seed $((SEED + k)) --threads "$THREADS" --print-ids 2>/dev/null |
      awk '{ printf "1"; for (i = 1; i <= NF && $i != 1; i++) printf " %s", $i; printf "\n" }' >>"$f.tmp"
    have=$(wc -w <"$f.tmp")
    if ((k > 1000)); then break; fi
  done
  record_seed "turns stream, $n ($k stories, seeds $((SEED + 1))..$((SEED + k)))" "$SEED"
  tr -s ' \n' '\n' <"$f.tmp" | head -n "$STREAM_LEN" | tr '\n' ' ' >"$f"
  echo "$k" >"$f.stories"
  rm -f "$f.tmp"
}

tag_of() {
  if [ "$1" = full ]; then echo full; return; fi
  IFS=: read -r _ w s p <<<"$1"
  echo "w${w}s${s}${p:0:3}"
}
label_of() {
  if [ "$1" = full ]; then echo "full"; return; fi
  IFS=: read -r _ w s p <<<"$1"
  echo "W=$w S=$s $p"
}

# Per-position NLL from --logits-out: the line for query position p holds the logits that predict
# token p+1; writes "p,nll" for p = 0..len-2.
nll_of() {
  awk 'NR == FNR { for (i = 1; i <= NF; i++) id[n++] = $i; next }
    { p = $1; if (p + 1 >= n) next
      m = -1e30; for (i = 2; i <= NF; i++) if ($i > m) m = $i
      s = 0; for (i = 2; i <= NF; i++) s += exp($i - m)
      printf "%d,%.5f\n", p, m + log(s) - $(id[p + 1] + 2) }' "$1" "$2"
}
# Centered moving average over SMOOTH positions: "p,nll" -> "p,nll,ma".
smooth() {
  awk -F, -v k="$SMOOTH" '{ p[NR] = $1; v[NR] = $2 }
    END { h = int(k / 2)
      for (i = 1; i <= NR; i++) { s = 0; c = 0
        for (j = i - h; j <= i + h; j++) if (j >= 1 && j <= NR) { s += v[j]; c++ }
        printf "%s,%s,%.5f\n", p[i], v[i], s / c } }' "$1"
}

# 2. Score every stream under every setting.
csv="$OUT/06_quality.csv"
echo "model,stream,setting,trained_ctx,tokens,ppl_all,ppl_within,ppl_beyond,score_ppl" >"$csv"
for n in "${names[@]}"; do
  ctx="${MCTX[$n]}"
  mapfile -t ma < <(model_args "$n")
  for stream in $STREAMS; do
    ids="$RAW/${n}_$stream.ids"
    progress "$n (trained context $ctx): making the $stream stream, $STREAM_LEN tokens"
    case "$stream" in
      free) make_free "$n" "$ids" "$FREE_KV" ;;
      free-window) make_free "$n" "$ids" "$FREE_WINDOW" ;;
      turns) make_turns "$n" "$ids" ;;
      *) echo "06_quality: unknown stream '$stream'" >&2; exit 2 ;;
    esac
    for setting in $SETTINGS; do
      tag="$(tag_of "$setting")"
      kv=(--kv full --max-context "$STREAM_LEN")
      if [ "$setting" != full ]; then
        IFS=: read -r _ w s p <<<"$setting"
        kv=(--kv window --window "$w" --sinks "$s" --positions "$p")
      fi
      progress "$n, $stream stream: score, $(label_of "$setting")"
      line="$("$BIN" score "${ma[@]}" --ids-file "$ids" "${kv[@]}" --threads "$THREADS" \
        --logits-out "$RAW/logits.tmp" 2>&1 | grep '^tokens' | tail -n 1)"
      nll_of "$ids" "$RAW/logits.tmp" >"$RAW/nll.tmp"
      smooth "$RAW/nll.tmp" >"$RAW/${n}_${stream}_$tag.csv"
      rm -f "$RAW/logits.tmp" "$RAW/nll.tmp"
      score_ppl="$(grep -o 'ppl [0-9.]*' <<<"$line" | cut -d' ' -f2)"
      awk -F, -v c="$ctx" -v pre="$n,$stream,$(label_of "$setting"),$ctx" -v sp="${score_ppl:-}" '
        { a += $2; na++; if ($1 < c) { w += $2; nw++ } else { b += $2; nb++ } }
        function ppl(s, k) { return k > 0 ? sprintf("%.3f", exp(s / k)) : "" }
        END { printf "%s,%d,%s,%s,%s,%s\n", pre, na + 1, ppl(a, na), ppl(w, nw), ppl(b, nb), sp }' \
        "$RAW/${n}_${stream}_$tag.csv" >>"$csv"
    done
  done
done

# 3. The table.
{
  echo "Teacher-forced perplexity of ${STREAM_LEN}-token streams each model wrote itself (free: one sampled generation at T=$FREE_TEMP under $FREE_KV attention; free-window: the same under $(label_of "$FREE_WINDOW") attention; turns: short sampled stories joined with BOS). Within / beyond: query positions < / >= the trained context. Window settings keep W recent tokens + S sinks; with S=0, absolute and rolling positions score the same (RoPE sees only query-key distances)."
  echo
  echo "| model | stream | setting | ppl, all | ppl, within trained context | ppl, beyond trained context |"
  echo "| --- | --- | --- | ---: | ---: | ---: |"
  tail -n +2 "$csv" | while IFS=, read -r m st se c _ pa pw pb _; do
    echo "| $m (ctx $c) | $st | $se | $pa | ${pw:--} | ${pb:--} |"
  done
} >"$OUT/06_quality.md"

# 4. The plot: the first model, one panel per stream.
n="${names[0]}"
ctx="${MCTX[$n]}"
colors=("#555555" "#e67e22" "#c0392b" "#7fb3d5" "#2471a3" "#27ae60" "#8e44ad" "#16a085")
nstreams=$(wc -w <<<"$STREAMS")
panels=""
for stream in $STREAMS; do
  cmd=""
  i=0
  for setting in $PLOT_SETTINGS; do
    f="$RAW/${n}_${stream}_$(tag_of "$setting").csv"
    [ -f "$f" ] || continue
    dt=1
    if [[ "$setting" == *absolute ]]; then dt=2; fi
    cmd="$cmd${cmd:+, }'$f' using 1:3 with lines lw 1.6 dt $dt lc rgb '${colors[$((i % 8))]}' title '$(label_of "$setting")'"
    i=$((i + 1))
  done
  panels="$panels
set title '$stream stream'
set arrow 1 from $ctx, graph 0 to $ctx, graph 1 nohead dt 3 lc rgb '#333333'
set label 1 'trained context $ctx' at $ctx, graph 0.04 offset 0.5,0 font ',10'
plot $cmd"
done
plot "
set output '$OUT/06_quality.png'
set terminal pngcairo size $((80 + 520 * nstreams)),650 font 'DejaVu Sans,11' linewidth 1.5
set multiplot layout 1,$nstreams title '$n: per-position NLL (${SMOOTH}-token moving average), ${STREAM_LEN}-token streams' font ',13'
set xlabel 'query position'; set ylabel 'NLL of the next token (nats)'
set xrange [0:$STREAM_LEN]; set yrange [0:*]
set key top left
$panels
unset multiplot
"
finish
