#!/usr/bin/env bash
# Builds the container image of deploy/Dockerfile and checks it (deploy/README.md, "The image"):
#   bash scripts/container_test.sh [--bin PATH] [--full]
# By default the runtime stage is built around a host build's binary (--bin, default
# build/ci/apps/metronome; build arg BINARY_STAGE=prebuilt), so the check costs seconds, not a
# second full build; --full builds both stages, as `docker build -f deploy/Dockerfile .` does.
# Checks: the image runs as a non-root user; `serve` comes up through the ENTRYPOINT with the
# model given in place of CMD; /healthz answers through the published port; the image's
# HEALTHCHECK passes in the container; a loadgen run through the port admits its sessions with
# frames on time; the agent port answers where the binary has --agent-port; SIGTERM ends the
# container with status 0.
# Needs docker with a daemon, or podman (`bash scripts/setup.sh --container`: podman, runc,
# debootstrap). No registry is reachable here, so the Debian base image is made with debootstrap
# from Debian's archive and imported as localhost/debian:bookworm when it is not there yet.
# scripts/test.sh runs this when METRONOME_CONTAINER_TEST=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/ci/apps/metronome
full=0
while (($# > 0)); do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --full) full=1; shift ;;
    *) echo "container_test: unknown argument '$1' (--bin PATH, --full)" >&2; exit 2 ;;
  esac
done
say() { echo "[container] $*"; }
fail() { echo "container_test: $*" >&2; exit 1; }
[ -x "$bin" ] || { echo "container_test: no metronome binary at '$bin' (build it, or --bin)" >&2; exit 2; }

tmp="$(mktemp -d)"
cid=""
cleanup() {
  if [ -n "$cid" ]; then $engine rm -f "$cid" >/dev/null 2>&1 || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

if docker info >/dev/null 2>&1; then
  engine=docker
  base=debian:bookworm
  slim=debian:bookworm-slim
  build_flags=()
elif command -v podman >/dev/null; then
  engine=podman
  # This sandbox (deploy/README.md, "Containers on this machine"): crun cannot run containers on
  # its cgroup v1 + empty v2 hierarchy, runc can; podman's default rlimits exceed the hard limits
  # the process has. A containers.conf of our own, for this script only.
  cat >"$tmp/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=4096:4096"]
[engine]
runtime = "runc"
EOF
  export CONTAINERS_CONF="$tmp/containers.conf"
  base=localhost/debian:bookworm
  slim=$base
  # The docker image format keeps HEALTHCHECK (OCI's drops it).
  build_flags=(--format docker)
  if ! podman image exists "$base"; then
    command -v debootstrap >/dev/null || fail "no $base image and no debootstrap (scripts/setup.sh --container)"
    say "making $base: debootstrap --variant=minbase bookworm (Debian's archive), podman import"
    debootstrap --variant=minbase bookworm "$tmp/rootfs" http://deb.debian.org/debian >"$tmp/debootstrap.log" 2>&1 ||
      { tail -n 20 "$tmp/debootstrap.log" >&2; fail "debootstrap failed"; }
    tar -C "$tmp/rootfs" -c . | podman import - "$base" >/dev/null
    rm -rf "$tmp/rootfs"
  fi
else
  echo "container_test: neither a docker daemon nor podman (scripts/setup.sh --container)" >&2
  exit 2
fi
say "engine: $engine ($($engine --version))"

image=metronome:container-test
args=(build "${build_flags[@]}" -f deploy/Dockerfile -t "$image" --build-arg "DEBIAN_IMAGE=$base"
  --build-arg "DEBIAN_SLIM_IMAGE=$slim")
if ((full == 0)); then
  mkdir -p build/container
  cp "$bin" build/container/metronome
  args+=(--build-arg BINARY_STAGE=prebuilt)
else
  # Explicit: podman 4.3 (buildah) takes the ARG's default in `FROM ${BINARY_STAGE}` for an image
  # name ("short-name "build" did not resolve"), a value given on the command line for a stage.
  args+=(--build-arg BINARY_STAGE=build)
fi
say "building the image ($( ((full)) && echo both stages || echo "runtime stage around $bin"))"
$engine "${args[@]}" . >"$tmp/build.log" 2>&1 || { tail -n 30 "$tmp/build.log" >&2; fail "image build failed"; }

# The model in place of CMD (a small one: the check is the image, not the engine); the agent port
# where this binary has it.
serve_args=(--model synthetic:tiny --threads 1 --window 64 --sinks 4 --admission aimd --kv-guard)
agent=0
if "$bin" serve --help 2>/dev/null | grep -q -- '--agent-port'; then
  serve_args+=(--agent-port 8081)
  agent=1
fi
# (podman without systemd says on stderr that it cannot schedule the periodic health checks;
# `podman healthcheck run` below runs the check itself.)
cid="$($engine run -d -p 127.0.0.1::8080 -p 127.0.0.1::8081 "$image" "${serve_args[@]}" 2>"$tmp/run.err")" ||
  { cat "$tmp/run.err" >&2; fail "$engine run failed"; }
port="$($engine port "$cid" 8080 | head -n 1 | sed 's/.*://')"
say "container ${cid:0:12} up, 8080 published on 127.0.0.1:$port"

user="$($engine exec "$cid" id -u)"
[ "$user" != 0 ] || fail "the container runs as root"
say "runs as uid $user"

for _ in $(seq 1 120); do
  if curl -sf -m 2 "http://127.0.0.1:$port/healthz" >/dev/null; then break; fi
  if [ "$($engine inspect --format '{{.State.Running}}' "$cid")" != true ]; then
    $engine logs "$cid" | tail -n 20 >&2
    fail "the container exited before /healthz answered"
  fi
  sleep 0.5
done
[ "$(curl -sf -m 2 "http://127.0.0.1:$port/healthz")" = ok ] || fail "/healthz did not answer ok on port $port"
say "/healthz: ok"

if [ "$engine" = podman ]; then
  podman healthcheck run "$cid" || fail "the image's HEALTHCHECK failed inside the container"
else
  test_cmd="$(docker inspect --format '{{join .Config.Healthcheck.Test " "}}' "$cid")"
  [[ "$test_cmd" == "CMD bash -c "* ]] || fail "unexpected HEALTHCHECK: $test_cmd"
  docker exec "$cid" bash -c "${test_cmd#CMD bash -c }" || fail "the image's HEALTHCHECK failed"
fi
say "HEALTHCHECK: passes"

if ((agent)); then
  aport="$($engine port "$cid" 8081 | head -n 1 | sed 's/.*://')"
  reply="$(timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$aport && head -n 1 <&3")" ||
    fail "the agent port did not answer"
  [[ "$reply" == *up* ]] || fail "the agent said '$reply', not up"
  say "agent: $reply"
fi

summary="$("$bin" loadgen --url "ws://127.0.0.1:$port" --sessions 2 --period-ms 100 --tokens-per-frame 2 \
  --output-tokens-per-frame 1 --kv window --window 64 --sinks 4 --duration 3 --summary-json \
  --quiet | tail -n 1)"
admitted="$(jq -r .admitted <<<"$summary")"
frames="$(jq -r .frames <<<"$summary")"
ok="$(jq -r .ok_frames <<<"$summary")"
[ "$admitted" = 2 ] || fail "loadgen: $admitted of 2 sessions admitted ($summary)"
((frames > 0 && ok == frames)) || fail "loadgen: $ok of $frames frames ok ($summary)"
say "loadgen through the container: 2 sessions admitted, $ok / $frames frames ok"

$engine stop -t 20 "$cid" >/dev/null
rc="$($engine inspect --format '{{.State.ExitCode}}' "$cid")"
[ "$rc" = 0 ] || { $engine logs "$cid" | tail -n 20 >&2; fail "exit status $rc after SIGTERM"; }
say "SIGTERM: exit status 0"
say "passed"
