#!/usr/bin/env bash
# The Podman job: the Docker-backed integration tests that matter for an engine (up, a rolling
# upgrade under load, drift repair, down, engine errors, a reboot) against a private Podman API
# service (scripts/podman-service.sh), through DOCKER_HOST as a user would point berth at it.
# Run after the main suite (.ci/run); needs dockerd for `docker save` of the test images.
#
# It lists only tests that run on Podman 4.3 (Debian's); the ones left out are named below with
# the reason. It fails when any test it runs fails, or when fewer tests ran than it lists (a
# renamed test must not drop out unseen). It also runs the upgrade test once against Docker, so
# that the rollout figures of both engines come from the same run: see the "rollout figures"
# lines at the end.
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

# Tests of the binaries below that do not run on Podman 4.3, and why.
excluded=(
  "rollout docker_update_memory_replaces_that_replica_only: Podman's compatible API has no container update (POST /containers/{id}/update answers 404 in 4.3), so nobody can change a replica's memory that way there"
  "docker_engine a_cached_observation_inspects_only_what_changed: Podman keeps its events elsewhere, so observe_cached observes in full there (nothing is cached to check)"
)
failures=()

# run_tests BINARY FLAGS NAME...: runs exactly the named tests of tests/BINARY.rs (FLAGS: extra
# libtest flags, e.g. --ignored); a failure, or fewer tests passing than named, is recorded.
# Prints the output (with show=brief: only the figures and the result).
run_tests() {
  local bin=$1 flags=$2 out ran
  shift 2
  if [ $# -eq 0 ]; then
    failures+=("tests/$bin.rs: no test listed")
    return
  fi
  out=$(mktemp /tmp/berth-podman-run.XXXXXX)
  # shellcheck disable=SC2086
  if ! cargo test --test "$bin" -- --nocapture --exact $flags "$@" 2>&1 | tee -a "$log" >"$out"; then
    failures+=("tests/$bin.rs: a test failed")
  fi
  ran=$(grep -Eo 'test result: [A-Za-z]+\. [0-9]+ passed' "$out" | tail -n 1 | grep -Eo '[0-9]+' || true)
  if [ "${ran:-0}" -ne $# ]; then
    failures+=("tests/$bin.rs: $# tests listed, ${ran:-0} passed")
  fi
  if [ "${show:-all}" = brief ]; then
    grep -E "rollout figures|test result|panicked" "$out" || true
  else
    cat "$out"
  fi
  rm -f "$out"
}

images=(berth/envoy:1.39.3 berth/envoy:1.40.0
  berth-test/envoy:1.39.3 berth-test/envoy:1.40.0 berth-test/envoy:exits-at-start)
scripts/test-images.sh >/dev/null

# The same upgrade on Docker first (the main suite ran it, but captured its figures).
echo "==> on Docker: the upgrade test, for its figures"
show=brief run_tests rollout "" upgrade_three_replicas_under_load_loses_no_request

eval "$(scripts/podman-service.sh start)"
podman --version
env -u DOCKER_HOST docker save "${images[@]}" | scripts/podman-service.sh podman load -q >/dev/null
echo "DOCKER_HOST=$DOCKER_HOST; images loaded into Podman's store: ${images[*]}"
echo "Left out on Podman:"
printf '  %s\n' "${excluded[@]}"

# docker_engine: all of it but the excluded test (its tests are the engine adapter's own).
engine_tests=$(cargo test -q --test docker_engine -- --list 2>/dev/null | sed -n 's/: test$//p' |
  grep -vxF a_cached_observation_inspects_only_what_changed)
# shellcheck disable=SC2086
run_tests docker_engine "" $engine_tests
run_tests up_down "" \
  up_three_replicas_behind_one_port_all_serve \
  second_up_makes_no_container_changes \
  status_and_diff_describe_the_fleet \
  down_removes_what_berth_made_and_spares_a_lookalike \
  missing_image_refuses_up_clearly
run_tests rollout "" \
  upgrade_three_replicas_under_load_loses_no_request \
  an_image_that_exits_at_start_is_refused_and_the_old_replicas_serve \
  a_replica_removed_by_hand_is_restored \
  drift_is_put_back_stopped_renamed_and_tampered_files
# What only Podman needs proving; ignored in the main suite, which has no Podman service.
# serve's drift repair on Podman is in tests/podman.rs (after the reboot, with resync off).
run_tests podman --ignored \
  an_engine_refusal_names_podman_and_quotes_it \
  replicas_come_back_after_a_podman_reboot_and_serve_reconciles

echo
echo "==> Podman job: $(($(date +%s) - start)) s"
echo "Left out on Podman:"
printf '  %s\n' "${excluded[@]}"
grep -E "^SKIPPED" "$log" || true
grep -E "rollout figures" "$log" || true
if [ ${#failures[@]} -gt 0 ]; then
  echo "Podman job FAILED:"
  printf '  %s\n' "${failures[@]}"
  exit 1
fi
