#!/usr/bin/env bash
# Starts or stops a private Podman API service for berth's tests: its own socket, storage,
# run directory and containers.conf under $BERTH_PODMAN_DIR (default /run/berth-podman), so it
# touches neither the host's Podman store nor the Docker daemon.
#
#   scripts/podman-service.sh start [--default-ulimits]   # prints: export DOCKER_HOST=unix://…
#   scripts/podman-service.sh load IMAGE...                # copies images from Docker into it
#   scripts/podman-service.sh stop                         # stops the service and its containers
#
# `--default-ulimits` keeps Podman's built-in container ulimits (nofile 1048576), which a host
# whose hard limit is lower refuses: the engine-error test wants exactly that.
set -euo pipefail

dir=${BERTH_PODMAN_DIR:-/run/berth-podman}
sock=$dir/podman.sock
conf=$dir/containers.conf
pidfile=$dir/service.pid
podman_args=(--root "$dir/storage" --runroot "$dir/run" --tmpdir "$dir/tmp")

podman_() { CONTAINERS_CONF=$conf podman "${podman_args[@]}" "$@"; }

write_conf() {
  local ulimits=$1
  mkdir -p "$dir" "$dir/tmp"
  {
    echo '[containers]'
    # Podman's built-in default (nofile=1048576:1048576) exceeds many hosts' hard limit,
    # and then no container starts ("error setting rlimit"). Empty: inherit the service's.
    [ "$ulimits" = keep ] || echo 'default_ulimits = []'
    # Debian's build logs to journald by default; without a journald (CI) every log is lost.
    echo 'log_driver = "k8s-file"'
    echo '[engine]'
    # No systemd as PID 1 on CI machines: cgroupfs, and events in a file (no journald).
    echo 'cgroup_manager = "cgroupfs"'
    echo 'events_logger = "file"'
    echo "events_logfile_path = \"$dir/events.log\""
  } >"$conf"
}

ping() { curl -fsS --max-time 2 --unix-socket "$sock" http://d/_ping >/dev/null 2>&1; }

case ${1:-} in
  start)
    ulimits=empty
    [ "${2:-}" = --default-ulimits ] && ulimits=keep
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "podman service already running (pid $(cat "$pidfile")); stop it first" >&2
      exit 1
    fi
    command -v podman >/dev/null || {
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null
    }
    write_conf "$ulimits"
    rm -f "$sock"
    # --time=0: never exit for being idle. The service must not inherit our other file
    # descriptors: under `flock /tmp/berth-docker.lock` one of them holds the docker lock,
    # which a service left running would keep for everyone.
    (
      for fd in /proc/$BASHPID/fd/*; do
        fd=${fd##*/}
        [ "$fd" -gt 2 ] && eval "exec $fd>&-"
      done
      CONTAINERS_CONF=$conf exec podman "${podman_args[@]}" system service --time=0 \
        "unix://$sock" </dev/null >"$dir/service.log" 2>&1
    ) &
    echo $! >"$pidfile"
    for _ in $(seq 1 100); do ping && break; sleep 0.1; done
    ping || { echo "podman service did not answer on $sock:" >&2; cat "$dir/service.log" >&2; exit 1; }
    echo "export DOCKER_HOST=unix://$sock"
    ;;
  load)
    shift
    # Through the socket, as a user would (`docker save | podman load`).
    docker save "$@" | podman_ load -q >/dev/null
    ;;
  stop)
    if [ -S "$sock" ] && ping; then
      podman_ rm -af -t 0 >/dev/null 2>&1 || true
    fi
    if [ -f "$pidfile" ]; then
      pid=$(cat "$pidfile")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$pidfile"
    fi
    rm -f "$sock"
    ;;
  podman)
    shift
    podman_ "$@"
    ;;
  *)
    echo "usage: $0 start [--default-ulimits] | load IMAGE... | stop | podman ARGS..." >&2
    exit 2
    ;;
esac
