#!/usr/bin/env bash
# The loopback cluster (scripts/cluster.sh: three replicas behind HAProxy) with every scenario
# and its checks: capacity and overload, kill -9 of a replica, SIGTERM drain, and a rolling update
# that loses no conversation. Skips (77) when haproxy is missing, except under CI=true, where that
# is a failure (scripts/setup.sh installs it).
# Usage: cluster_test.sh METRONOME_BINARY
set -euo pipefail
if ! command -v haproxy >/dev/null; then
  echo "haproxy not found (run scripts/setup.sh)"
  [[ "${CI:-}" == true ]] && exit 1
  exit 77
fi
exec bash "$(dirname "$0")/../../scripts/cluster.sh" all --bin "$1"
