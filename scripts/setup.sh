#!/usr/bin/env bash
# Set up an mq-sidecar development / CI machine (Debian bookworm). Idempotent; prints
# nothing when there is nothing to do. Works from any directory.
#
#  1. Installs the real brokers the test suite starts by itself (harness/testbed/): the Debian
#     packages activemq (ActiveMQ Classic 5.17, pulls in Java 17) and rabbitmq-server
#     (RabbitMQ 3.10 + rabbitmq_stomp, pulls in Erlang 25), and prometheus (the server and
#     promtool: the admin-plane tests lint /metrics with `promtool check metrics` and let a real
#     Prometheus scrape the sidecar), plus python3-venv when the venv must be created. Needs root; without root and without the packages it exits 1.
#     While installing, a temporary /usr/sbin/policy-rc.d (exit 101) keeps the packages'
#     postinst scripts from starting services (unless the machine already has one).
#     Also ruby-stomp (the Ruby `stomp` gem 1.4.10, pulls in ruby) for tests/clients/ruby, curl
#     (an HTTP client of the admin-token tests), openssl (the test bed turns PEM files into
#     ActiveMQ's PKCS12 key store with `openssl pkcs12`; keytool comes with Java), socat (the
#     C byte relay the benchmarks measure next to the sidecar, bench/relay.py), strace
#     (`python -m bench.syscalls` counts system calls per round trip with `strace -c`),
#     chromium and chromium-driver (tests/browser load the admin page in headless Chromium
#     through Selenium, which drives /usr/bin/chromedriver), and
#     Debian's npm only when no `npm` is on PATH (a Node.js build that bundles npm, as
#     nodesource's, conflicts with Debian's npm package).
#  2. On a host running systemd, disables the services the packages enable on default
#     ports (rabbitmq-server on 5672, epmd on 4369, activemq, prometheus on 9090): the tests
#     run their own brokers and Prometheus on free ports and need none of them.
#  3. Creates .venv in the repository root (python3 -m venv) if missing and installs, editable,
#     the runtime with its test extras (pip install -e '.[test]') and the test harness
#     (pip install -e harness: testbed, pipeline, the drill's PySpark stack, and the `demo` and
#     `drill` commands) and the PySpark data source (pip install -e spark: mq-sidecar-spark,
#     with pyarrow, which Spark's Python data sources need on the executors); skipped while
#     pyproject.toml, harness/pyproject.toml and spark/pyproject.toml are unchanged since the
#     last successful install (their hash in .venv/.mq-sidecar-setup).
#  3b. Compiles the pure core with mypyc, in place (setup.py with MQ_SIDECAR_COMPILE=1: an
#     extension module beside each compiled source, and protocol/_native.sha256); about 25 s
#     with gcc and the Python headers, done again when protocol/_native.py finds the build
#     stale (a compiled source changed) or setup.py changed. MQ_SIDECAR_PURE=1 leaves it out:
#     the sources then run as they are (docs/architecture.md, "The compiled core").
#  4. Deploy tooling (scripts/get-tools.sh).
#  5. The Node.js STOMP client (stompit, pinned in tests/clients/node/package-lock.json) into
#     tests/clients/node/node_modules with `npm ci`; skipped while package-lock.json is
#     unchanged since the last successful install (its hash in node_modules/.mq-sidecar-setup).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
STAMP="$VENV/.mq-sidecar-setup"
PACKAGES=(activemq rabbitmq-server prometheus ruby-stomp curl openssl socat strace chromium chromium-driver dnsmasq)
SERVICES=(rabbitmq-server epmd.socket epmd.service activemq prometheus dnsmasq)

say() { printf 'setup.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# Run a command quietly; show its output only if it fails.
quiet() {
    local log
    log="$(mktemp)"
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        die "failed: $*"
    fi
    rm -f "$log"
}

is_root() { [ "$(id -u)" -eq 0 ]; }

pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'; }

# --- 1. packages ---------------------------------------------------------------------------
command -v dpkg-query >/dev/null || die "not a Debian system (no dpkg-query): install ActiveMQ 5.17, RabbitMQ 3.10 and Prometheus (promtool) by hand"

missing=()
for pkg in "${PACKAGES[@]}"; do
    pkg_installed "$pkg" || missing+=("$pkg")
done
if [ ! -x "$VENV/bin/python" ] && ! pkg_installed python3-venv; then
    missing+=(python3-venv)
fi
command -v npm >/dev/null || missing+=(npm)
command -v gcc >/dev/null || missing+=(gcc)

if [ "${#missing[@]}" -gt 0 ]; then
    is_root || die "missing Debian packages: ${missing[*]}; run this script as root (e.g. sudo $0) to install them"
    say "installing ${missing[*]} (apt-get)"
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# temporary, from mq-sidecar scripts/setup.sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        trap 'rm -f "$policy"' EXIT
    fi
    quiet apt-get update
    quiet env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    if [ -e "$policy" ] && grep -q 'mq-sidecar scripts/setup.sh' "$policy"; then
        rm -f "$policy"
        trap - EXIT
    fi
fi

# --- 2. services on a systemd host ----------------------------------------------------------
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    to_disable=()
    for unit in "${SERVICES[@]}"; do
        # "static"/"indirect" units (epmd.service) also exit 0 from is-enabled: compare text.
        state="$(systemctl is-enabled "$unit" 2>/dev/null || true)"
        if [ "$state" = enabled ] || systemctl is-active --quiet "$unit" 2>/dev/null; then
            to_disable+=("$unit")
        fi
    done
    if [ "${#to_disable[@]}" -gt 0 ]; then
        if is_root; then
            say "stopping and disabling ${to_disable[*]} (the tests start their own brokers on free ports)"
            systemctl disable --now "${to_disable[@]}" >/dev/null 2>&1 || true
        else
            say "note: ${to_disable[*]} enabled or running on default ports; as root: systemctl disable --now ${to_disable[*]}"
        fi
    fi
fi

# --- 3. virtualenv ---------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    quiet python3 -m venv "$VENV"
fi

want="$(cat "$REPO/pyproject.toml" "$REPO/harness/pyproject.toml" "$REPO/spark/pyproject.toml" |
    sha256sum | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" != "$have" ]; then
    say "installing mq-sidecar[test], mq-sidecar-harness and mq-sidecar-spark into $VENV"
    quiet "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet \
        -e "$REPO[test]" -e "$REPO/spark" -e "$REPO/harness"
    printf '%s\n' "$want" >"$STAMP"
fi

# --- 3b. the compiled core (mypyc) ----------------------------------------------------------
compiled() {
    (cd "$REPO" && env -u MQ_SIDECAR_PURE "$VENV/bin/python" -c \
        'import sys, protocol._native as n; sys.exit(not n.COMPILED)')
}
case "${MQ_SIDECAR_PURE:-}" in
"" | 0)
    NATIVE_STAMP="$VENV/.mq-sidecar-native"
    want="$(sha256sum "$REPO/setup.py" | cut -d' ' -f1)"
    have="$(cat "$NATIVE_STAMP" 2>/dev/null || true)"
    if [ "$want" != "$have" ] || ! compiled; then
        say "compiling the core with mypyc (setup.py build_ext --inplace)"
        (cd "$REPO" && quiet env MQ_SIDECAR_COMPILE=1 "$VENV/bin/python" setup.py build_ext --inplace)
        compiled || die "the compiled core does not load after a build: $(cd "$REPO" &&
            "$VENV/bin/python" -c 'import protocol._native as n; print(n.STATUS)')"
        printf '%s\n' "$want" >"$NATIVE_STAMP"
    fi
    ;;
esac

# --- 4. deploy tooling (tests/deploy) --------------------------------------------------------
# helm into .venv/bin, and podman/buildah/debootstrap (Debian) for the image build test;
# idempotent and silent when everything is there. SKIP_IMAGE_BUILD=1 leaves out the image tools.
bash "$REPO/scripts/get-tools.sh"

# --- 5. Node.js client for tests/clients/node ------------------------------------------------
NODE_DIR="$REPO/tests/clients/node"
NODE_STAMP="$NODE_DIR/node_modules/.mq-sidecar-setup"
want="$(sha256sum "$NODE_DIR/package-lock.json" | cut -d' ' -f1)"
have="$(cat "$NODE_STAMP" 2>/dev/null || true)"
if [ "$want" != "$have" ]; then
    say "installing stompit into $NODE_DIR/node_modules (npm ci)"
    (cd "$NODE_DIR" && quiet npm ci --no-audit --no-fund --loglevel=error)
    printf '%s\n' "$want" >"$NODE_STAMP"
fi
