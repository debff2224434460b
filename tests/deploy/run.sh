#!/usr/bin/env bash
# The deploy stage: the container image, the compose stack and the Kubernetes manifests of
# deploy/, run for real on this machine.
#
#   tests/deploy/run.sh BUILD_DIR        (deploy/setup-debian.sh test runs it as the deploy stage)
#
# 1. The Kubernetes manifests load into the kubernetes client's typed models (no unknown field)
#    and keep their invariants (test_kubernetes.py): no daemon needed.
# 2. A private Docker daemon of its own (its own socket, data and exec roots under a temporary
#    directory; no default bridge), a Debian base image made with debootstrap (no registry is
#    reachable), the sidecar image built from a bundle of BUILD_DIR on it, and Debian's Prometheus
#    on the same base; then test_container.py (the image alone) and test_compose.py (the stack).
# Everything the daemon made is removed through it, then the daemon is stopped by its PID and its
# directory deleted. Installs docker.io, docker-compose and debootstrap with apt-get if missing.
# The container half is skipped, saying why, only where this machine cannot run containers at all
# (not root and no sudo, or no namespaces); any other failure fails the stage.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
build="$(cd "${1:?usage: tests/deploy/run.sh BUILD_DIR}" && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
pytest=("$python" -m pytest -q -rs -p no:cacheprovider)

echo "== deploy: Kubernetes manifests"
"${pytest[@]}" tests/deploy/test_kubernetes.py

sudo=""
if [[ "$(id -u)" != 0 ]]; then
  if ! sudo -n true 2>/dev/null; then
    echo "== deploy: container tests SKIPPED: the Docker daemon needs root (not root, no sudo)"
    exit 0
  fi
  sudo="sudo -n"
fi
if ! $sudo unshare --pid --mount --net --fork true 2>/dev/null; then
  echo "== deploy: container tests SKIPPED: this kernel or sandbox refuses new namespaces"
  exit 0
fi

missing=()
for p in docker.io docker-compose debootstrap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== apt-get install ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The package's own client: BuildKit needs it (another docker on PATH may be a newer client).
docker_cli=/usr/bin/docker

state="$(mktemp -d /tmp/probe-sidecar-deploy.XXXXXX)"
chmod 0755 "$state"
export DOCKER_HOST="unix://$state/docker.sock"
docker() { $sudo env DOCKER_HOST="$DOCKER_HOST" DOCKER_BUILDKIT=1 "$docker_cli" "$@"; }
dockerd_pid=""
cleanup() {
  local rc=$?
  set +e
  if [[ -n "$dockerd_pid" ]]; then
    # What the tests left (they remove their own; this is for a failed or interrupted run).
    local ids
    ids="$(docker ps -aq)" && [[ -n "$ids" ]] && docker rm -f $ids >/dev/null
    ids="$(docker images -q)" && [[ -n "$ids" ]] && docker rmi -f $ids >/dev/null
    docker volume prune -f >/dev/null
    docker network prune -f >/dev/null
    $sudo kill -TERM "$dockerd_pid"
    for _ in $(seq 150); do $sudo kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.2; done
    if $sudo kill -0 "$dockerd_pid" 2>/dev/null; then
      echo "deploy: dockerd ($dockerd_pid) did not stop in 30 s: killing it" >&2
      $sudo kill -KILL "$dockerd_pid"
      rc=1
    fi
  fi
  # Overlay mounts of the daemon are gone once it has stopped; the directory goes with them.
  $sudo umount -R "$state/exec" "$state/data" 2>/dev/null
  $sudo rm -rf "$state"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== deploy: dockerd (private: $state)"
# --bridge=none: no default bridge (the containers here name their networks), so this daemon
# never touches another daemon's docker0; --iptables=false: nothing is routed out of containers.
$sudo dockerd --iptables=false --ip6tables=false --storage-driver=overlay2 --bridge=none \
  --data-root "$state/data" --exec-root "$state/exec" --pidfile "$state/dockerd.pid" \
  -H "$DOCKER_HOST" >"$state/dockerd.log" 2>&1 &
dockerd_pid=$!
for _ in $(seq 150); do
  docker version >/dev/null 2>&1 && break
  if ! kill -0 "$dockerd_pid" 2>/dev/null && ! $sudo kill -0 "$dockerd_pid" 2>/dev/null; then
    dockerd_pid=""
    echo "deploy: dockerd exited at start:" >&2
    tail -20 "$state/dockerd.log" >&2
    exit 1
  fi
  sleep 0.2
done
docker version --format 'dockerd {{.Server.Version}} (client {{.Client.Version}})'

echo "== deploy: base image debian:bookworm (debootstrap)"
# The mirror apt uses here (deb822 or one-line sources).
mirror="$(grep -rhoE '^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)https?://[^[:space:]]+/debian/?([[:space:]]|$)' \
  /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | grep -oE 'https?://[^[:space:]]+' | head -1 || true)"
mirror="${mirror:-http://deb.debian.org/debian}"
start=$SECONDS
$sudo debootstrap --variant=minbase bookworm "$state/rootfs" "$mirror" >"$state/debootstrap.log" 2>&1 ||
  { tail -20 "$state/debootstrap.log" >&2; exit 1; }
$sudo rm -rf "$state/rootfs/var/cache/apt/archives/"*.deb "$state/rootfs/var/lib/apt/lists/"*
$sudo tar -C "$state/rootfs" -c . | docker import - debian:bookworm >/dev/null
$sudo rm -rf "$state/rootfs"
echo "   from $mirror in $((SECONDS - start)) s"

echo "== deploy: images"
context="$state/context"
deploy/bundle.sh "$build" "$context/bundle" probe-sidecar probe-client
sidecar_image=probe-sidecar:deploy-test
prometheus_image=probe-sidecar-prometheus:deploy-test
# --network=none: the image needs nothing from outside, which this proves.
docker build -q --network=none --build-arg BASE=debian:bookworm -t "$sidecar_image" \
  -f deploy/container/Dockerfile "$context" >/dev/null
# Debian's prometheus package: this build needs the package mirror (the host's network).
docker build -q --network=host --build-arg BASE=debian:bookworm -t "$prometheus_image" \
  - <tests/deploy/prometheus.Dockerfile >/dev/null
docker images --format '   {{.Repository}}:{{.Tag}} {{.Size}}'

echo "== deploy: container and compose tests"
export DEPLOY_TEST_DOCKER="$docker_cli" DEPLOY_TEST_SUDO="$sudo"
export DEPLOY_TEST_SIDECAR_IMAGE="$sidecar_image" DEPLOY_TEST_PROMETHEUS_IMAGE="$prometheus_image"
export DEPLOY_TEST_BUNDLE="$context/bundle" DEPLOY_TEST_STATE="$state"
"${pytest[@]}" tests/deploy/test_container.py tests/deploy/test_compose.py

# The tests removed what they made; the images of this script go here, and nothing may be left.
docker rmi "$sidecar_image" "$prometheus_image" debian:bookworm >/dev/null
left="$(docker ps -aq; docker images -q; docker volume ls -q)"
if [[ -n "$left" ]]; then
  echo "deploy: left behind in the daemon:" >&2
  docker ps -a >&2
  docker images >&2
  docker volume ls >&2
  exit 1
fi
echo "== deploy: nothing left in the daemon"
