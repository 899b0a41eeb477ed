# Sourced by scripts/test.sh and scripts/podman-tests.sh. Every `berth up` and `berth serve` a
# test runs prepares the host (tcp_migrate_req, port and inotify limits). Tests in one binary run
# in parallel, so no single test can put these back without pulling them from under another:
# a suite saves them when it starts and restores them when it ends (an EXIT trap), and removes the
# drop-in directory the tests write instead of /etc/sysctl.d (tests/common TEST_SYSCTL_DROPIN).
host_sysctls=(net/ipv4/tcp_migrate_req net/ipv4/ip_unprivileged_port_start
  fs/inotify/max_user_instances fs/inotify/max_user_watches)
host_sysctls_saved=()
for key in "${host_sysctls[@]}"; do
  [ -r "/proc/sys/$key" ] && host_sysctls_saved+=("$key=$(cat "/proc/sys/$key")")
done
restore_host_sysctls() {
  local entry key value
  for entry in "${host_sysctls_saved[@]}"; do
    key=${entry%%=*} value=${entry#*=}
    [ "$(cat "/proc/sys/$key")" = "$value" ] || echo "$value" >"/proc/sys/$key" 2>/dev/null || true
  done
  rm -rf /tmp/berth-test-sysctl.d
}
