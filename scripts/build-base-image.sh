#!/usr/bin/env bash
# Build a local Python base image for the Dockerfile where no container registry is reachable:
# Debian bookworm (debootstrap minbase) with python3, python3-venv and ca-certificates, imported
# into podman's storage as localhost/mq-sidecar-base:bookworm (override with BASE_IMAGE=...).
# Build the sidecar image on it with: podman build --build-arg BASE_IMAGE=localhost/mq-sidecar-base:bookworm
#
# Idempotent and cached: exits at once when the image exists (about 40 s and 275 MB of
# download the first time). Needs root, debootstrap and podman (scripts/get-tools.sh installs
# them). The Debian mirror is the one apt already uses on this machine. Quiet unless it works
# or fails; a lock keeps two concurrent runs from building twice.
set -euo pipefail

IMAGE="${BASE_IMAGE:-localhost/mq-sidecar-base:bookworm}"
SUITE=bookworm

say() { printf 'build-base-image.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

command -v podman >/dev/null || die "podman is not installed (scripts/get-tools.sh installs it)"
podman image exists "$IMAGE" && exit 0
[ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap is not installed (scripts/get-tools.sh installs it)"

# The mirror apt uses: deb822 sources first, then one-line sources.
mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -e "$f" ] || continue
        awk -v suite="$SUITE" '
            /^URIs:/ { uri = $2 }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
            /^$/ { if (ok && uri != "") { print uri; exit } uri = ""; ok = 0 }
            END { if (ok && uri != "") print uri }
        ' "$f" | head -n1
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -e "$f" ] || continue
        awk -v suite="$SUITE" '$1 == "deb" && $3 == suite { print $2; exit }' "$f"
    done
}
MIRROR="$(mirror | head -n1)"
[ -n "$MIRROR" ] || die "no Debian $SUITE mirror found in apt's sources"

exec 9>/var/tmp/mq-sidecar-base-image.lock
flock 9
podman image exists "$IMAGE" && exit 0   # built by a concurrent run while we waited

work="$(mktemp -d /var/tmp/mq-sidecar-base.XXXXXX)"
trap 'rm -rf "$work"' EXIT
log="$work/debootstrap.log"
say "building $IMAGE with debootstrap ($SUITE, minbase + python3); about 40 s, once"
if ! debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$work/rootfs" "$MIRROR" >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "debootstrap failed"
fi
rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/* \
    "$work"/rootfs/var/log/* "$work"/rootfs/tmp/*
tar -C "$work/rootfs" --numeric-owner -c . \
    | podman import --quiet --change 'CMD ["/usr/bin/python3"]' - "$IMAGE" >/dev/null
say "built $IMAGE"
