#!/usr/bin/env bash
# Rehearses the package install in a clean Debian root: debootstraps bookworm (minbase, plus
# systemd for `systemctl enable` and `systemd-analyze`) into a folder under /tmp, installs
# berth's .deb there with dpkg -i and follows the README's steps inside it (chroot): berth
# version and --help, the manual and completions, an /etc/berth/berth.toml from the packaged
# examples that `berth render` and `berth validate --no-envoy` accept, `systemctl enable berth`
# (systemd is not running in a chroot: enable only links the unit), `systemd-analyze verify`,
# then dpkg -r. Docker-bound steps stay on the host (scripts/package-test.sh). Prints each
# step's time; removes the root at the end (BERTH_REHEARSAL_KEEP=1 keeps it).
#
#   scripts/rehearse-install.sh [DEB]     default: builds one (scripts/package-deb.sh)
# Needs root, debootstrap and network access to a Debian mirror (BERTH_DEBIAN_MIRROR, default
# http://deb.debian.org/debian).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
mirror=${BERTH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d /tmp/berth-rehearsal.XXXXXX)
t0=$SECONDS
mark=$SECONDS
step() { printf '==> [%3ds, +%3ds] %s\n' "$((SECONDS - t0))" "$((SECONDS - mark))" "$*"; mark=$SECONDS; }
fail() { echo "rehearsal: FAILED: $*" >&2; exit 1; }
finish() {
  # Everything mounted below the root (ours: proc, dev; debootstrap's if it failed), deepest
  # first; the removal never crosses into a file system still mounted there.
  awk -v d="$root/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
  rm -f "$root.debootstrap.log"
  if [ -n "${BERTH_REHEARSAL_KEEP:-}" ]; then echo "kept $root"; else rm -rf --one-file-system "$root"; fi
}
trap finish EXIT
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }

deb=${1:-}
if [ -z "$deb" ]; then
  step "building the package"
  deb=$(scripts/package-deb.sh | tail -n1)
fi
[ -f "$deb" ] || fail "no package at $deb"

step "debootstrap bookworm (minbase + systemd) into $root"
debootstrap --variant=minbase --include=systemd bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
  { tail -n 30 "$root.debootstrap.log" >&2; fail "debootstrap"; }
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
echo "  $(du -sh --exclude=proc --exclude=dev "$root" 2>/dev/null | cut -f1), $(in_root dpkg-query -W | wc -l) packages"

step "dpkg -i $(basename "$deb")"
cp "$deb" "$root/tmp/berth.deb"
in_root dpkg -i /tmp/berth.deb
in_root test -x /usr/bin/berth || fail "no /usr/bin/berth"

step "berth version / --help"
in_root berth version
in_root berth --help >/dev/null || fail "berth --help"
in_root berth up --help | grep -q "Usage: berth up" || fail "berth up --help"

step "manual pages and completions"
in_root sh -c 'ls /usr/share/man/man1/berth*.1.gz | wc -l' | grep -qv '^0$' || fail "no manual pages"
in_root sh -c 'zcat /usr/share/man/man1/berth.1.gz | head -n 5' | grep -q '^\.TH berth 1' || fail "berth.1"
for f in /usr/share/bash-completion/completions/berth /usr/share/zsh/vendor-completions/_berth \
  /usr/share/fish/vendor_completions.d/berth.fish; do
  in_root test -s "$f" || fail "no $f"
done
echo "  $(in_root sh -c 'ls /usr/share/man/man1/berth*.1.gz | wc -l') manual pages, bash/zsh/fish completions"

step "write /etc/berth/berth.toml (the packaged quickstart), render and validate it"
in_root test -d /etc/berth || fail "no /etc/berth"
in_root cp /usr/share/doc/berth/examples/quickstart.toml /etc/berth/berth.toml
in_root berth -f /etc/berth/berth.toml render >"$root/tmp/render.out" || fail "berth render"
grep -q "hello from berth" "$root/tmp/render.out" || fail "the rendered files lack the quickstart's route"
in_root berth -f /etc/berth/berth.toml validate --no-envoy || fail "berth validate --no-envoy"

step "systemd-analyze verify, systemctl enable --now berth (in a chroot: enable only)"
in_root systemd-analyze verify /lib/systemd/system/berth.service 2>&1 | { grep -v 'docker.service' || true; } >"$root/tmp/verify.out"
[ ! -s "$root/tmp/verify.out" ] || fail "systemd-analyze verify: $(cat "$root/tmp/verify.out")"
# Enabling links the unit; starting it needs systemd as PID 1, which a chroot has not.
if ! out=$(in_root systemctl enable --now berth 2>&1); then
  grep -q "not been booted with systemd" <<<"$out" || fail "systemctl enable --now berth: $out"
fi
sed 's/^/  /' <<<"$out"
in_root test -L /etc/systemd/system/multi-user.target.wants/berth.service || fail "systemctl enable linked nothing"
in_root systemctl is-enabled berth | grep -qx enabled || fail "berth is not enabled"

step "dpkg -r berth"
in_root systemctl disable berth >/dev/null 2>&1
in_root dpkg -r berth
in_root test ! -e /usr/bin/berth || fail "/usr/bin/berth is still there"
in_root test -f /etc/berth/berth.toml || fail "the operator's berth.toml went with the package"

step "done: the install rehearsal passed in $((SECONDS - t0)) s"
