# Sourced by scripts that take one of the machine-wide locks under /tmp/berth-locks (flock(1)).
#
#   lock_holders PATH               who holds PATH: "pid N (command line)" per holder
#   take_lock FD PATH WHAT [shared] waits for PATH on descriptor FD (already open), saying who
#                                   holds it, for at most BERTH_LOCK_WAIT seconds (default 1800),
#                                   then fails naming the holders
lock_holders() {
  local path=$1 inode pid
  inode=$(stat -c %i "$path" 2>/dev/null) || return 0
  # /proc/locks: "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF" (pid, then dev:inode).
  awk -v ino="$inode" '$2 == "FLOCK" { n = split($6, f, ":"); if (f[n] == ino) print $5 }' /proc/locks |
    sort -u | while read -r pid; do
      [ -r "/proc/$pid/cmdline" ] || continue
      printf 'pid %s (%s)\n' "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -c1-200 | sed 's/ $//')"
    done
}

take_lock() {
  local fd=$1 path=$2 what=$3 mode=-x wait=${BERTH_LOCK_WAIT:-1800}
  [ "${4:-}" = shared ] && mode=-s
  flock -n $mode "$fd" && return 0
  echo "waiting up to ${wait}s for $path ($what); held by: $(lock_holders "$path" | paste -sd';' -)" >&2
  if ! flock -w "$wait" $mode "$fd"; then
    echo "gave up after ${wait}s waiting for $path ($what); still held by: $(lock_holders "$path" | paste -sd';' -)" >&2
    echo "(if that process is stuck, stop it; BERTH_LOCK_WAIT=SECONDS waits longer)" >&2
    return 1
  fi
}
