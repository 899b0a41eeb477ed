#!/usr/bin/env bash
# The Podman job: the Docker-backed integration tests that matter for an engine (up, a rolling
# upgrade under load, drift repair, down, engine errors, a reboot) against a private Podman API
# service (scripts/podman-service.sh), through DOCKER_HOST as a user would point berth at it.
# Run after the main suite (.ci/run); needs dockerd for `docker save` of the test images.
#
# It also runs the upgrade test once against Docker, so that the rollout figures of both
# engines come from the same run: see the "rollout figures" lines at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

export BERTH_PODMAN_DIR=${BERTH_PODMAN_DIR:-/run/berth-podman-ci}
start=$(date +%s)
log=$(mktemp /tmp/berth-podman-tests.XXXXXX)
source scripts/host-sysctls.sh
podman_dir_existed=$([ -e "$BERTH_PODMAN_DIR" ] && echo yes || true)
# Stops the service, removes its private store (a few hundred MB, in /run: memory) if this job
# made it, and puts back the sysctls the tests' `berth up` tuned.
finish() {
  scripts/podman-service.sh stop
  [ -n "$podman_dir_existed" ] || rm -rf "$BERTH_PODMAN_DIR"
  rm -f "$log"
  restore_host_sysctls
}
trap finish EXIT

images=(berth/envoy:1.39.3 berth/envoy:1.40.0
  berth-test/envoy:1.39.3 berth-test/envoy:1.40.0 berth-test/envoy:exits-at-start)
scripts/test-images.sh >/dev/null

# The same upgrade on Docker first (the main suite ran it, but captured its figures).
cargo test -q --test rollout upgrade_three_replicas_under_load_loses_no_request \
  -- --exact --nocapture 2>&1 | tee -a "$log" | grep -E "rollout figures|test result|panicked" || true

eval "$(scripts/podman-service.sh start)"
podman --version
env -u DOCKER_HOST docker save "${images[@]}" | scripts/podman-service.sh podman load -q >/dev/null
echo "DOCKER_HOST=$DOCKER_HOST; images loaded into Podman's store: ${images[*]}"

# Each test names what it checks; tests that cannot run on Podman print "SKIPPED …: why".
# serve's drift repair on Podman is in tests/podman.rs (after the reboot, with resync off).
cargo test --test docker_engine -- --nocapture 2>&1 | tee -a "$log"
cargo test --test up_down -- --nocapture \
  up_three_replicas_behind_one_port_all_serve \
  second_up_makes_no_container_changes \
  status_and_diff_describe_the_fleet \
  down_removes_what_berth_made_and_spares_a_lookalike \
  missing_image_refuses_up_clearly 2>&1 | tee -a "$log"
cargo test --test rollout -- --nocapture \
  upgrade_three_replicas_under_load_loses_no_request \
  an_image_that_exits_at_start_is_refused_and_the_old_replicas_serve \
  a_replica_removed_by_hand_is_restored \
  docker_update_memory_replaces_that_replica_only \
  drift_is_put_back_stopped_renamed_and_tampered_files 2>&1 | tee -a "$log"
cargo test --test podman -- --nocapture 2>&1 | tee -a "$log"

echo
echo "==> Podman job: $(($(date +%s) - start)) s"
grep -E "^SKIPPED" "$log" || true
grep -E "rollout figures" "$log" || true
