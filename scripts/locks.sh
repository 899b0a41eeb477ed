# Sourced by scripts that take one of the machine-wide locks under /tmp/berth-locks (flock(1)).
#
#   lock_holders PATH               who holds PATH: "pid N (command line)" per holder
#   take_lock FD PATH WHAT [shared] waits for PATH on descriptor FD (already open), saying who
#                                   holds it, for at most BERTH_LOCK_WAIT seconds (default 1800),
#                                   then fails naming the holders
lock_holders() {
  local path=$1 inode pid ppid skip
  inode=$(stat -c %i "$path" 2>/dev/null) || return 0
  # /proc/locks names the process that took the lock ("1: FLOCK ADVISORY WRITE PID dev:INODE"),
  # and waiters on "->" lines. With flock(1) on an inherited descriptor (flock -n 9) the taker
  # exits at once and the lock stays with whoever shares the descriptor: so the holders are the
  # processes with the file open, but for waiters, their parents, and this shell and its own.
  skip=" $$ $(awk -v ino="$inode" '$2 == "->" { n = split($7, f, ":"); if (f[n] == ino) print $6 }' /proc/locks |
    while read -r pid; do echo "$pid $(awk '{ print $4 }' "/proc/$pid/stat" 2>/dev/null)"; done | paste -sd' ' -) "
  find /proc/[0-9]*/fd -maxdepth 1 -lname "$path" 2>/dev/null | cut -d/ -f3 | sort -un | while read -r pid; do
    [[ $skip == *" $pid "* ]] && continue
    # A descendant of this shell (a subshell, a command it runs) holds what this shell holds.
    ppid=$pid
    while [ "${ppid:-1}" -gt 1 ] && [ "$ppid" != $$ ]; do
      ppid=$(awk '{ print $4 }' "/proc/$ppid/stat" 2>/dev/null)
    done
    [ "$ppid" = $$ ] && continue
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
