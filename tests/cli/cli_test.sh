#!/usr/bin/env bash
# End-to-end tests of the `metronome` command line: exact spellings other tools rely on, the
# reference outputs of ../shared/models, and clean failures on bad input.
# Usage: cli_test.sh <metronome binary> <shared models dir>
set -uo pipefail
bin="$1"
models="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
pass=0

check() {  # check NAME COMMAND...: the command must succeed
  local name="$1"
  shift
  if "$@"; then
    pass=$((pass + 1))
  else
    echo "FAIL: $name"
    failures=$((failures + 1))
  fi
}

fails_with() {  # fails_with NAME PATTERN ARGS...: metronome must exit 2 and print PATTERN
  local name="$1" pattern="$2"
  shift 2
  local out rc
  out="$("$bin" "$@" 2>&1)"
  rc=$?
  if [ "$rc" -eq 2 ] && grep -q -- "$pattern" <<<"$out"; then
    pass=$((pass + 1))
  else
    echo "FAIL: $name (rc=$rc): $out"
    failures=$((failures + 1))
  fi
}

# --- synthetic models: always available -------------------------------------------------------
"$bin" generate --model synthetic:tiny --prompt-ids "1 5 9" --steps 24 --print-ids \
  >"$tmp/tiny.ids" 2>/dev/null
check "generate prints 24 ids on one line" \
  test "$(wc -w <"$tmp/tiny.ids")" -eq 24 -a "$(wc -l <"$tmp/tiny.ids")" -eq 1

"$bin" export-gguf --model synthetic:tiny --out "$tmp/tiny.gguf" --dtype f32 >/dev/null
"$bin" generate --model "$tmp/tiny.gguf" --prompt-ids "1 5 9" --steps 24 --print-ids \
  >"$tmp/tiny_gguf.ids" 2>/dev/null
check "exported f32 GGUF generates the same ids" cmp -s "$tmp/tiny.ids" "$tmp/tiny_gguf.ids"
"$bin" export-gguf --model synthetic:tiny --out "$tmp/tiny16.gguf" --dtype f16 >/dev/null
check "f16 export loads and encodes text" \
  "$bin" generate --model "$tmp/tiny16.gguf" --prompt "hello" --steps 4 --print-ids >/dev/null 2>&1

"$bin" generate --model synthetic:tiny --prompt-ids "1 5 9" --steps 24 --print-ids \
  --kv window --window 4096 --sinks 4 --positions rolling >"$tmp/tiny_w.ids" 2>/dev/null
check "a window longer than the run equals full KV" cmp -s "$tmp/tiny.ids" "$tmp/tiny_w.ids"

out="$("$bin" score --model synthetic:tiny --ids "1 2 3 4 5 6" --logits-out "$tmp/lg.txt")"
check "score prints ppl and mean_nll" grep -Eq "mean_nll [0-9.]+ ppl [0-9.]+" <<<"$out"
check "score writes one logits line per position" test "$(wc -l <"$tmp/lg.txt")" -eq 6
check "logits lines are pos + vocab values" \
  test "$(head -1 "$tmp/lg.txt" | wc -w)" -eq 513

out="$("$bin" bench-decode --model synthetic:tiny --sessions 4 --context 32 --steps 3 --kv window \
  --window 16 --sinks 2)"
check "bench-decode reports a peak fraction" grep -Eq "^peak fraction [0-9.]+$" <<<"$out"
check "bench-decode reports tokens/s" grep -q "decode tokens/s" <<<"$out"

out="$("$bin" demo --sessions 4 --steps 40)"
check "demo prints per-session lines and pool use" grep -q "KV pool used" <<<"$out"

out="$("$bin" calibrate --batch-sessions 1,2 --contexts 8,32 --chunk-tokens 1,4 --repeats 2 \
  --threads 1 --out "$tmp/calib.json")"
check "calibrate ends with the fit as a JSON line" \
  grep -q '^{.*"c2_s_per_kv_token"' <<<"$(tail -n 1 <<<"$out")"
check "calibrate --out has the three coefficients, each >= 0" test "$(grep -Ec \
  '^  "(c0_s|c1_s_per_token|c2_s_per_kv_token)": [0-9]' "$tmp/calib.json")" -eq 3
check "calibrate --out has the fit quality" test "$(grep -Ec \
  '^    "(r2|median_abs_rel_error|max_abs_rel_error|num_points)": ' "$tmp/calib.json")" -eq 4

fails_with "missing model file" "cannot open" generate --model "$tmp/none.gguf" --prompt-ids 1
printf 'GGUF\x03\x00\x00\x00' >"$tmp/short.gguf"
fails_with "truncated GGUF" "short.gguf" generate --model "$tmp/short.gguf" --prompt-ids 1
printf 'GGUF\x09\x00\x00\x00AAAAAAAAAAAAAAAAAAAAAAAA' >"$tmp/ver.gguf"
fails_with "unsupported GGUF version" "version" generate --model "$tmp/ver.gguf" --prompt-ids 1
fails_with "unknown synthetic preset" "tiny" generate --model synthetic:nope --prompt-ids 1
fails_with "token id out of range" "99999" generate --model synthetic:tiny --prompt-ids "1 99999"
fails_with "bad token text" "'x'" score --model synthetic:tiny --ids "1 x 3"
fails_with "window 0" "window" generate --model synthetic:tiny --prompt-ids 1 --kv window --window 0
fails_with "calibrate grid value 0" "--batch-sessions = '0,4'" calibrate --batch-sessions 0,4

# --- real models from ../shared (skipped when absent) --------------------------------------------
if [ -f "$models/stories260K.bin" ]; then
  ref="$models/stories260K.greedy256.tokens.txt"
  "$bin" generate --model "$models/stories260K.bin" --tokenizer "$models/tok512.bin" \
    --prompt-ids "1" --steps 256 --temperature 0 --print-ids >"$tmp/s.ids" 2>/dev/null
  check "stories260K.bin greedy ids match llama2.c" \
    test "1 $(cat "$tmp/s.ids")" = "$(cat "$ref")"
  "$bin" generate --model "$models/stories260K.gguf" --prompt-ids "1" --steps 256 \
    --temperature 0 2>/dev/null >"$tmp/s.txt"
  check "stories260K.gguf greedy text matches llama2.c byte for byte" \
    cmp -s "$tmp/s.txt" "$models/stories260K.greedy256.txt"
  "$bin" score --model "$models/stories260K.bin" --ids-file "$ref" --logits-out "$tmp/s_lg.txt" \
    >/dev/null
  # Position 10 of the reference logits file against ours, max abs difference < 1e-4.
  check "score logits match the llama2.c reference at position 10" awk -v want="$(grep '^10 ' \
    "$models/stories260K.logits.txt")" '$1 == 10 { n = split(want, w, " "); m = 0;
      for (i = 2; i <= n; i++) { d = $i - w[i]; if (d < 0) d = -d; if (d > m) m = d }
      found = 1; exit (m < 1e-4 ? 0 : 1) } END { if (!found) exit 1 }' "$tmp/s_lg.txt"
  head -c 100000 "$models/stories260K.bin" >"$tmp/stories_cut.bin"
  fails_with "truncated llama2.c checkpoint" "stories_cut.bin" generate --model \
    "$tmp/stories_cut.bin" --prompt-ids 1
else
  echo "SKIP: $models not available; real-model CLI checks skipped"
fi

echo "cli: $pass passed, $failures failed"
[ "$failures" -eq 0 ]
