#!/usr/bin/env bash
# Runs the whole test suite: pure unit tests, golden files, the hostile-config corpus, and the
# integration tests against the real Docker engine and real Envoy images.
#
# A test that cannot run here (a peer, root or a host feature is missing) fails under CI (CI
# set) and is skipped elsewhere: the skips are listed at the end (tests/common/skip.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
# Puts the sysctls the tests tune back when the suite ends, and lists the skipped tests.
source scripts/host-sysctls.sh
BERTH_SKIP_LOG=$(mktemp /tmp/berth-skips.XXXXXX)
export BERTH_SKIP_LOG
finish() {
  restore_host_sysctls
  if [ -s "$BERTH_SKIP_LOG" ]; then
    echo
    echo "==> $(wc -l <"$BERTH_SKIP_LOG") test(s) passed without running (with CI=1 they fail):"
    cat "$BERTH_SKIP_LOG"
  fi
  rm -f "$BERTH_SKIP_LOG"
}
trap finish EXIT
scripts/test-images.sh >/dev/null
cargo test --all-targets "$@"
# Ignored tests belong to a CI job that runs them with --ignored (tests/harness.rs checks that
# each is run by one): here the engine restart (it restarts dockerd) and the negative control of
# the migrate_req scenario (it turns tcp_migrate_req off host-wide, under
# /tmp/berth-locks/sysctl.lock). CI runs them, and they fail there when they cannot run.
if [ -n "${CI:-}" ]; then
  cargo test --test engine_restart -- --ignored
  cargo test --test unattended -- --ignored control_serve_rollout_with_migrate_req_off_and_tune_host_off
fi
