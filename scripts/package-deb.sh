#!/usr/bin/env bash
# Builds berth's Debian package with dpkg-deb (no other packaging tool needed).
#
#   scripts/package-deb.sh [OUT_DIR]      default OUT_DIR: target/debian
#
# BERTH_BIN names the binary to package (default: the release build of this tree, built or
# brought up to date first: target/<host triple>/release/berth, static). Prints the path of the .deb on its last line.
#
# Contents: /usr/bin/berth (one static binary, also the Swarm agent); the systemd unit
# /lib/systemd/system/berth.service (berth serve on /etc/berth/berth.toml, state in
# /var/lib/berth); manual pages in /usr/share/man/man1 (berth man --dir, generated here);
# bash, zsh and fish completions (berth completions SHELL); README, docs/ and examples/ under
# /usr/share/doc/berth. The package starts nothing: write /etc/berth/berth.toml, then
# `systemctl enable --now berth`. Removing it stops berth serve (when systemd runs) and leaves
# the replicas serving (they are Docker's, restart policy unless-stopped) and /var/lib/berth,
# whose rendered files the running replicas mount.
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir=${1:-target/debian}
triple=$(rustc -vV | sed -n 's/^host: //p')
bin=${BERTH_BIN:-${CARGO_TARGET_DIR:-target}/$triple/release/berth}
# Unless told which binary, the release build of this tree (cargo makes sure it is current).
[ -n "${BERTH_BIN:-}" ] || cargo build --release --quiet --bin berth
[ -x "$bin" ] || { echo "no berth binary at $bin" >&2; exit 1; }
if LC_ALL=C readelf -l "$bin" | grep -q 'program interpreter'; then
  echo "$bin is dynamically linked; the package ships the static build (.cargo/config.toml)" >&2
  exit 1
fi

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
# Reproducible: every timestamp is the commit's.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

root=$(mktemp -d /tmp/berth-deb.XXXXXX)
trap 'rm -rf "$root"' EXIT
pkg=$root/berth
doc=$pkg/usr/share/doc/berth

install -D -m 0755 "$bin" "$pkg/usr/bin/berth"
# The example unit, pointed at the package's binary.
install -d "$pkg/lib/systemd/system"
awk '
  /^# The Debian package/ { print "# Installed by the berth package: write /etc/berth/berth.toml, then systemctl enable --now berth."; skip = 1; next }
  skip && /^#($|   )/ { next }
  { skip = 0; gsub("/usr/local/bin/berth", "/usr/bin/berth"); print }
' examples/berth.service >"$pkg/lib/systemd/system/berth.service"
grep -q '^ExecStart=/usr/bin/berth ' "$pkg/lib/systemd/system/berth.service" || { echo "examples/berth.service: no ExecStart to adapt" >&2; exit 1; }
chmod 0644 "$pkg/lib/systemd/system/berth.service"
install -d -m 0755 "$pkg/etc/berth"

install -d "$pkg/usr/share/man/man1"
"$bin" man --dir "$pkg/usr/share/man/man1"
gzip -9n "$pkg"/usr/share/man/man1/*.1

install -d "$pkg/usr/share/bash-completion/completions" "$pkg/usr/share/zsh/vendor-completions" \
  "$pkg/usr/share/fish/vendor_completions.d"
"$bin" completions bash >"$pkg/usr/share/bash-completion/completions/berth"
"$bin" completions zsh >"$pkg/usr/share/zsh/vendor-completions/_berth"
"$bin" completions fish >"$pkg/usr/share/fish/vendor_completions.d/berth.fish"

install -d "$doc"
install -m 0644 README.md "$doc/README.md"
cp -r docs "$doc/docs"
cp -r examples "$doc/examples"
cat >"$doc/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: berth
Files: *
License: Apache-2.0
 On Debian systems the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
EOF
find "$doc" -type d -exec chmod 0755 {} + && find "$doc" -type f -exec chmod 0644 {} +

install -d "$pkg/DEBIAN"
cat >"$pkg/DEBIAN/control" <<EOF
Package: berth
Version: $version
Architecture: $arch
Maintainer: berth developers <berth@localhost>
Section: admin
Priority: optional
Recommends: docker.io | docker-ce | podman
Installed-Size: $(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
Homepage: https://gateway.envoyproxy.io
Description: Envoy proxy fleets as Docker containers, without Kubernetes
 berth realizes Envoy Gateway's infra IR on one Docker host (or a Docker Swarm):
 it renders each proxy's Envoy bootstrap, runs N replicas behind one host port
 and keeps them converged, replacing replicas start-first and health-gated.
 .
 Write /etc/berth/berth.toml, then: systemctl enable --now berth
EOF
# Stop serve when the package goes (never the replicas: they are not its children).
cat >"$pkg/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl stop berth.service >/dev/null 2>&1 || true
fi
EOF
cat >"$pkg/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
EOF
cat >"$pkg/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
EOF
chmod 0755 "$pkg/DEBIAN/prerm" "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/postrm"
(cd "$pkg" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"
find "$pkg" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$out_dir"
deb=$out_dir/berth_${version}_${arch}.deb
dpkg-deb --root-owner-group -Z"${BERTH_DEB_COMPRESSION:-xz}" --build "$pkg" "$deb" >/dev/null
echo "$deb"
