#!/usr/bin/env bash
# The Docker Swarm the Swarm tests (tests/common/swarm.rs) and `scripts/bench.sh swarm` run on,
# made on this machine and removed again, also after a crashed run.
#
#   scripts/test-swarm.sh hold 1|2    make a Swarm of 1 or 2 nodes, print one line
#                                     "ready key=value ..." on stdout, keep it until stdin ends
#                                     (EOF: the caller closed it or died), then remove it all
#   scripts/test-swarm.sh sweep       remove what a crashed run left (run by `hold` first)
#
# One node: the host's engine becomes a single-node Swarm (--advertise-addr 127.0.0.1). An engine
# in a Swarm this harness did not make is refused (it may be someone else's, in use).
# Two nodes: a network namespace berth-swarmnet-w1 joined to the host by a veth pair
# (10.231.0.1 host side, 10.231.0.2 inside: the subnet reserved for this harness), a second
# dockerd entered into it with nsenter (its own config file, data root, exec root, socket, pid
# file and cgroup parent, the host's storage driver, no bridge, no iptables: the host's engine
# and docker0 are untouched) and its own hostname (UTS namespace), the host's engine as the
# Swarm's manager on 10.231.0.1 and the second one as a worker, and a registry (Debian's
# docker-registry, TLS with a CA made here, htpasswd) on 10.231.0.1:5000 that both engines
# trust through /etc/docker/certs.d/10.231.0.1:5000/ca.crt, with a DOCKER_CONFIG logged in to it.
# The worker's net.ipv4.tcp_migrate_req is 1 (net.ipv4 sysctls belong to the namespace).
#
# The ready line: nodes=N manager_addr=A manager_node=ID [worker_addr=A worker_node=ID
# worker_host=unix://… worker_netns=NAME registry=HOST:PORT registry_user=U registry_password=P
# registry_ca=FILE registry_log=FILE docker_config=DIR] made=0|1 dir=DIR.
#
# The Swarm is engine-global and shared by everyone on the machine: `hold` takes
# /tmp/berth-locks/swarm.lock for the Swarm's whole life (unless BERTH_SWARM_LOCK_HELD=1 says
# an ancestor holds it; a wait names the holder and gives up after BERTH_LOCK_WAIT seconds,
# scripts/locks.sh) and no process it starts inherits the lock. What it makes lives under
# /tmp/berth-swarmnet/run (facts recorded as files there), which is how `sweep` finds leftovers.
set -euo pipefail
source "$(dirname "$0")/locks.sh"

LOCK=/tmp/berth-locks/swarm.lock
ROOT=/tmp/berth-swarmnet
RUN=$ROOT/run
NETNS=berth-swarmnet-w1
VETH_HOST=bsnet-h1
VETH_NS=bsnet-w1
MANAGER_ADDR=10.231.0.1
WORKER_ADDR=10.231.0.2
PREFIX=24
WORKER_HOSTNAME=berth-swarmnet-w1
REGISTRY=$MANAGER_ADDR:5000
CERTS_D=/etc/docker/certs.d/$REGISTRY
REGISTRY_USER=berth

log() { echo "test-swarm: $*" >&2; }
die() { log "$*"; exit 1; }

worker_docker() { docker -H "unix://$RUN/worker/docker.sock" "$@"; }

# Waits up to $1 tenths of a second for command "${@:2}" to succeed.
wait_for() {
  local tenths=$1; shift
  for ((i = 0; i < tenths; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

# Stops process $1 (TERM, then KILL after $2 seconds).
stop_pid() {
  local pid=$1 grace=$2
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  log "process $pid did not stop within ${grace}s: killing it"
  kill -KILL "$pid" 2>/dev/null || true
  sleep 0.2
}

# Unmounts everything mounted below $1, deepest first (dockerd leaves its netns bind mount in
# the exec root, which would keep the namespace alive; fuse-overlayfs layers, shm).
unmount_below() {
  local dir=$1
  awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
}

remove_gwbridge() {
  # Leaving the Swarm keeps the bridge `swarm init` made; its last endpoint goes a moment later.
  for ((i = 0; i < 50; i++)); do
    docker network inspect docker_gwbridge >/dev/null 2>&1 || return 0
    docker network rm docker_gwbridge >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  log "could not remove docker_gwbridge: $(docker network rm docker_gwbridge 2>&1)"
}

# Removes everything under $RUN and what its facts name; idempotent, also for a half-made run.
teardown() {
  [ -d "$RUN" ] || return 0
  # The worker leaves first (its tasks stop there), then the manager, if this run made the Swarm.
  if [ -f "$RUN/worker/dockerd.pid" ]; then
    local pid
    pid=$(cat "$RUN/worker/dockerd.pid")
    if kill -0 "$pid" 2>/dev/null; then
      worker_docker swarm leave --force >/dev/null 2>&1 || true
    fi
  fi
  if [ -f "$RUN/made-swarm" ]; then
    docker swarm leave --force >/dev/null 2>&1 || log "could not leave the Swarm: $(docker swarm leave --force 2>&1)"
  fi
  [ -f "$RUN/made-gwbridge" ] && remove_gwbridge
  if [ -f "$RUN/worker/dockerd.pid" ]; then
    stop_pid "$(cat "$RUN/worker/dockerd.pid")" 30
  fi
  # What still runs in the namespace (a container shim whose dockerd was killed) is ours.
  if ip netns list | grep -qw "$NETNS"; then
    for pid in $(ip netns pids "$NETNS" 2>/dev/null); do stop_pid "$pid" 5; done
  fi
  [ -f "$RUN/registry/pid" ] && stop_pid "$(cat "$RUN/registry/pid")" 5
  [ -f "$RUN/made-certs-d" ] && rm -rf "$CERTS_D"
  unmount_below "$RUN"
  ip netns list | grep -qw "$NETNS" && ip netns delete "$NETNS"
  ip link show "$VETH_HOST" >/dev/null 2>&1 && ip link delete "$VETH_HOST"
  rm -rf "$RUN"
}

# What a crashed run left: its recorded facts, and anything of this harness's names and
# addresses (nobody else uses them: the namespace prefix and subnet are reserved for it).
sweep() {
  if [ -d "$RUN" ]; then
    log "removing what an earlier run left ($RUN)"
    teardown
  fi
  for ns in $(ip netns list | awk '$1 ~ /^berth-swarmnet-/ { print $1 }'); do
    log "removing the leftover namespace $ns"
    for pid in $(ip netns pids "$ns" 2>/dev/null); do stop_pid "$pid" 5; done
    ip netns delete "$ns"
  done
  ip link show "$VETH_HOST" >/dev/null 2>&1 && ip link delete "$VETH_HOST"
  for d in /etc/docker/certs.d/$MANAGER_ADDR:*; do
    [ -e "$d" ] && { log "removing the leftover $d"; rm -rf "$d"; }
  done
  # A Swarm on the harness's address is a leftover of this harness.
  if [ "$(docker info --format '{{.Swarm.NodeAddr}}' 2>/dev/null)" = "$MANAGER_ADDR" ]; then
    log "leaving the leftover Swarm on $MANAGER_ADDR"
    docker swarm leave --force >/dev/null
    remove_gwbridge
  fi
  return 0
}

swarm_state() { docker info --format '{{.Swarm.LocalNodeState}} {{.Swarm.ControlAvailable}}'; }

make_single() {
  local state
  state=$(swarm_state)
  case "$state" in
    "inactive false")
      docker network inspect docker_gwbridge >/dev/null 2>&1 || touch "$RUN/made-gwbridge"
      docker swarm init --advertise-addr 127.0.0.1 >/dev/null || die "the engine cannot become a Swarm manager"
      touch "$RUN/made-swarm" ;;
    *) die "the engine is in a Swarm already (state: $state) that this harness did not make: the tests make their own and leave it; leave that one first (docker swarm leave --force) if it is nobody's" ;;
  esac
  READY="nodes=1 manager_addr=127.0.0.1 manager_node=$(docker info --format '{{.Swarm.NodeID}}')"
}

make_worker_netns() {
  ip netns add "$NETNS"
  ip link add "$VETH_HOST" type veth peer name "$VETH_NS"
  ip link set "$VETH_NS" netns "$NETNS"
  ip addr add "$MANAGER_ADDR/$PREFIX" dev "$VETH_HOST"
  ip link set "$VETH_HOST" up
  nsenter --net="/run/netns/$NETNS" sh -c "
    ip addr add $WORKER_ADDR/$PREFIX dev $VETH_NS && ip link set $VETH_NS up && ip link set lo up &&
    sysctl -qw net.ipv4.tcp_migrate_req=1"
}

start_worker_dockerd() {
  local w=$RUN/worker driver
  mkdir -p "$w/data" "$w/exec"
  driver=$(docker info --format '{{.Driver}}')
  # Its own config file: the host's daemon.json names data-root, which clashes with the flag.
  echo '{}' >"$w/daemon.json"
  # Its own containerd (dockerd starts one under its exec root when /run/containerd has none):
  # a shared one would start the worker's containers in the host's network namespace.
  [ -S /run/containerd/containerd.sock ] && die "a system containerd runs (/run/containerd/containerd.sock): the worker's dockerd would share it"
  # nsenter, not `ip netns exec` (which remounts /sys and hides the cgroup mounts); a UTS
  # namespace of its own gives the node its own hostname. No inherited lock (9>&-), no stdin.
  nsenter --net="/run/netns/$NETNS" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$WORKER_HOSTNAME" \
    dockerd --config-file "$w/daemon.json" --data-root "$w/data" --exec-root "$w/exec" \
    -H "unix://$w/docker.sock" --pidfile "$w/docker.pid" --cgroup-parent berth-swarmnet-w1 \
    --storage-driver "$driver" --iptables=false --ip-masq=false --bridge=none \
    </dev/null >"$w/dockerd.log" 2>&1 9>&- &
  echo $! >"$w/dockerd.pid"
  wait_for 300 worker_docker version || die "the worker's dockerd did not start: $(tail -n 20 "$w/dockerd.log")"
}

start_registry() {
  local r=$RUN/registry
  mkdir -p "$r/data"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=berth-test-swarm-registry-ca -keyout "$r/ca.key" -out "$r/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=$MANAGER_ADDR" -keyout "$r/tls.key" -out "$r/tls.csr" 2>/dev/null
  printf 'subjectAltName=IP:%s\n' "$MANAGER_ADDR" >"$r/ext"
  openssl x509 -req -in "$r/tls.csr" -CA "$r/ca.crt" -CAkey "$r/ca.key" -CAcreateserial -days 2 \
    -extfile "$r/ext" -out "$r/tls.crt" 2>/dev/null
  REGISTRY_PASSWORD=$(openssl rand -hex 12)
  htpasswd -Bbn "$REGISTRY_USER" "$REGISTRY_PASSWORD" >"$r/htpasswd" 2>/dev/null
  # Level info: each request's line names the client's address and user (what the tests check
  # the worker's pull by).
  cat >"$r/config.yml" <<EOF
version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $r/data
  delete:
    enabled: true
http:
  addr: $REGISTRY
  tls:
    certificate: $r/tls.crt
    key: $r/tls.key
auth:
  htpasswd:
    realm: berth-test
    path: $r/htpasswd
EOF
  docker-registry serve "$r/config.yml" </dev/null >"$r/registry.log" 2>&1 9>&- &
  echo $! >"$r/pid"
  mkdir -p "$CERTS_D"
  touch "$RUN/made-certs-d"
  cp "$r/ca.crt" "$CERTS_D/ca.crt"
  registry_up() { [ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$r/ca.crt" "https://$REGISTRY/v2/")" = 401 ]; }
  wait_for 200 registry_up || die "the registry did not start: $(tail -n 20 "$r/registry.log")"
  mkdir -p "$RUN/docker-config"
  echo "$REGISTRY_PASSWORD" | DOCKER_CONFIG=$RUN/docker-config \
    docker login -u "$REGISTRY_USER" --password-stdin "$REGISTRY" >/dev/null 2>&1 \
    || die "docker login $REGISTRY failed"
}

make_two() {
  local state
  state=$(swarm_state)
  [ "$state" = "inactive false" ] || die "the host's engine is in a Swarm already (state: $state): a two-node test Swarm needs an engine in none"
  make_worker_netns
  start_worker_dockerd
  docker network inspect docker_gwbridge >/dev/null 2>&1 || touch "$RUN/made-gwbridge"
  touch "$RUN/made-swarm"
  docker swarm init --advertise-addr "$MANAGER_ADDR" --listen-addr "$MANAGER_ADDR:2377" >/dev/null
  worker_docker swarm join --advertise-addr "$WORKER_ADDR" --listen-addr "$WORKER_ADDR:2377" \
    --token "$(docker swarm join-token worker -q)" "$MANAGER_ADDR:2377" >/dev/null
  two_ready() { [ "$(docker node ls --format '{{.Status}}' | grep -c Ready)" = 2 ]; }
  wait_for 300 two_ready || die "the worker did not become Ready: $(docker node ls 2>&1)"
  start_registry
  READY="nodes=2 manager_addr=$MANAGER_ADDR manager_node=$(docker info --format '{{.Swarm.NodeID}}')"
  READY+=" worker_addr=$WORKER_ADDR worker_node=$(worker_docker info --format '{{.Swarm.NodeID}}')"
  READY+=" worker_host=unix://$RUN/worker/docker.sock worker_netns=$NETNS worker_hostname=$WORKER_HOSTNAME"
  READY+=" registry=$REGISTRY registry_user=$REGISTRY_USER registry_password=$REGISTRY_PASSWORD"
  READY+=" registry_ca=$RUN/registry/ca.crt registry_log=$RUN/registry/registry.log"
  READY+=" docker_config=$RUN/docker-config"
}

hold() {
  local nodes=$1
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, a second dockerd, /etc/docker/certs.d)"
  for tool in docker dockerd nsenter unshare ip openssl; do
    command -v "$tool" >/dev/null || die "$tool is missing"
  done
  if [ "$nodes" = 2 ]; then
    for tool in docker-registry htpasswd curl; do
      command -v "$tool" >/dev/null || die "$tool is missing (.ci/run installs docker-registry, apache2-utils, curl)"
    done
  fi
  if [ "${BERTH_SWARM_LOCK_HELD:-}" != 1 ]; then
    mkdir -p "$(dirname "$LOCK")"
    exec 9>>"$LOCK"
    take_lock 9 "$LOCK" "another Swarm user" || die "no Swarm: $LOCK stayed taken"
  fi
  # Ctrl-C reaches the whole process group: the caller dies, stdin ends, and this tears down.
  trap '' INT
  trap teardown EXIT
  trap 'exit 1' TERM HUP
  sweep
  mkdir -p "$RUN"
  local started=$SECONDS
  case "$nodes" in
    1) make_single ;;
    2) make_two ;;
    *) die "hold 1|2" ;;
  esac
  [ -f "$RUN/made-swarm" ] && made=1 || made=0
  echo "ready $READY made=$made dir=$RUN setup_seconds=$((SECONDS - started))"
  # Until the caller closes stdin (or dies).
  while read -r _; do :; done
}

case "${1:-}" in
  hold) hold "${2:-}" ;;
  sweep)
    if [ "${BERTH_SWARM_LOCK_HELD:-}" != 1 ]; then
      mkdir -p "$(dirname "$LOCK")"
      exec 9>>"$LOCK"
      take_lock 9 "$LOCK" "another Swarm user" || die "no sweep: $LOCK stayed taken"
    fi
    sweep ;;
  *) echo "usage: $0 hold 1|2 | sweep" >&2; exit 2 ;;
esac
