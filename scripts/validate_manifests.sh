#!/usr/bin/env bash
# Checks deploy/kubernetes/ offline (CI runs this from scripts/test.sh):
#   1. every manifest against the Kubernetes API's JSON schemas, unknown fields included
#      (deploy/validate/validate.mjs: kubernetes-models + yaml, installed by scripts/setup.sh);
#   2. the HAProxy configuration in haproxy.yaml's ConfigMap with `haproxy -c`;
#   3. that the check can fail: each broken copy of a manifest below must be rejected.
#   bash scripts/validate_manifests.sh
set -euo pipefail
cd "$(dirname "$0")/.."
validator=deploy/validate/validate.mjs
if [ ! -d deploy/validate/node_modules/kubernetes-models ]; then
  echo "validate_manifests: deploy/validate/node_modules is missing (run scripts/setup.sh)" >&2
  exit 2
fi
command -v haproxy >/dev/null || { echo "validate_manifests: haproxy missing (scripts/setup.sh)" >&2; exit 2; }
manifests=(deploy/kubernetes/*.yaml)

echo "[manifests] schema check: ${manifests[*]}"
node "$validator" "${manifests[@]}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The ConfigMap's haproxy.cfg, as the pod will see it.
node deploy/validate/configmap_value.mjs deploy/kubernetes/haproxy.yaml haproxy haproxy.cfg \
  >"$tmp/haproxy.cfg"
echo "[manifests] haproxy -c on haproxy.yaml's haproxy.cfg ($(haproxy -v | head -n 1 | cut -d' ' -f1-3))"
haproxy -c -f "$tmp/haproxy.cfg"

# Broken copies: FILE, sed expression, what is wrong. Each must fail the schema check.
negatives=(
  "metronome.yaml|s/containerPort: 8080/containerPort: \"http\"/|a port that is not an integer"
  "metronome.yaml|s/terminationGracePeriodSeconds:/terminationGracePeriodSecs:/|a misspelt field"
  "metronome.yaml|s/^spec:/spce:/|a misspelt top-level field"
  "hpa.yaml|s/kind: HorizontalPodAutoscaler/kind: HorizontalPodScaler/|an unknown kind"
  "hpa.yaml|s/name: metronome}/}/|a required field missing (scaleTargetRef.name)"
  "metronome.yaml|s/^    matchLabels:/    matchLabel:/|a misspelt selector"
  "metronome.yaml|s/secretName: metronome-cluster/secretNam: metronome-cluster/|a misspelt secret volume field"
)
for n in "${negatives[@]}"; do
  IFS='|' read -r file expr what <<<"$n"
  sed "$expr" "deploy/kubernetes/$file" >"$tmp/$file"
  if cmp -s "deploy/kubernetes/$file" "$tmp/$file"; then
    echo "validate_manifests: negative case '$what': '$expr' changed nothing in $file" >&2
    exit 1
  fi
  if out="$(node "$validator" "$tmp/$file" 2>&1)"; then
    echo "validate_manifests: the broken copy ($what) of $file passed the check" >&2
    exit 1
  fi
  echo "[manifests] rejected as expected ($what): $(grep -v '^ok ' <<<"$out" | head -n 1)"
done
echo "[manifests] ${#manifests[@]} files valid, ${#negatives[@]} broken copies rejected"
