#!/usr/bin/env bash
# Runs the whole test suite: pure unit tests, golden files, the hostile-config corpus, and the
# integration tests against the real Docker engine and real Envoy images.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every `berth up` and `berth serve` a test runs prepares the host (tcp_migrate_req, port and
# inotify limits). Tests in one binary run in parallel, so no single test can put these back
# without pulling them from under another: the suite restores them once, when it ends.
sysctls=(net/ipv4/tcp_migrate_req net/ipv4/ip_unprivileged_port_start
  fs/inotify/max_user_instances fs/inotify/max_user_watches)
saved=()
for key in "${sysctls[@]}"; do
  [ -r "/proc/sys/$key" ] && saved+=("$key=$(cat "/proc/sys/$key")")
done
restore_host() {
  for entry in "${saved[@]}"; do
    key=${entry%%=*} value=${entry#*=}
    [ "$(cat "/proc/sys/$key")" = "$value" ] || echo "$value" >"/proc/sys/$key" 2>/dev/null || true
  done
}
trap restore_host EXIT
scripts/test-images.sh >/dev/null
# The static binary the agent tests put into derived images (its own target directory).
scripts/agent-binary.sh >/dev/null
cargo test --all-targets "$@"
# The engine-restart test restarts dockerd, so it is ignored unless asked for; CI asks (and it
# fails there when it cannot restart the engine).
if [ -n "${CI:-}" ]; then
  cargo test --test engine_restart -- --ignored
fi
