# mq-sidecar container image: the wheel built from this repository (the runtime: protocol, proxy,
# config; not the test harness in harness/) in a virtualenv, run as a fixed non-root uid
# (10001), nothing written at run time (read-only root filesystem). The wheel carries the
# compiled core (mypyc, setup.py; docs/architecture.md, "The compiled core"); the build stage
# alone has the C compiler, and MQ_SIDECAR_PURE=1 in the container runs the sources instead.
#
#   docker build -t mq-sidecar:0.1.0 .
#   podman build --isolation chroot --format docker \
#       --build-arg BASE_IMAGE=localhost/mq-sidecar-base:bookworm -t mq-sidecar:dev .
#
# BASE_IMAGE: any Debian-like image with python3 >= 3.11 and its venv module; the official slim
# image by default, or a locally built one where no registry is reachable
# (scripts/build-base-image.sh). PIP_CA_BUNDLE: path of a CA bundle for pip inside the build
# (mount it, e.g. -v /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro), for networks whose
# TLS is intercepted; it is not copied into the image.
#
# Configuration: /etc/mq-sidecar/mq-sidecar.toml (MQ_SIDECAR_CONFIG; the image ships one with no
# keys, so every option has its default: STOMP on 127.0.0.1:61613, admin on 0.0.0.0:9464). Mount
# your own file over it (Kubernetes: a ConfigMap) and/or set MQ_SIDECAR_<OPTION> variables
# (credentials: MQ_SIDECAR_LOGIN / MQ_SIDECAR_PASSCODE from a Secret). SIGTERM drains within
# drain_timeout.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# --- build: wheel of this repository + venv with it and its dependencies ----------------------
FROM ${BASE_IMAGE} AS build
# Marks the build stage's cached layers (tests/deploy prunes old ones).
LABEL io.mq-sidecar.stage="build"
ARG PIP_CA_BUNDLE=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
SHELL ["/bin/sh", "-eu", "-c"]
WORKDIR /src
# A C compiler for the compiled core, and the Python headers where the base image has none
# (Debian's python3 needs python3-dev; the official images ship them). Build stage only.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install --yes --no-install-recommends gcc libc6-dev \
    && if ! python3 -c 'import sysconfig, os; os.stat(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null; then \
        apt-get install --yes --no-install-recommends python3-dev; \
    fi \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/build \
    && python3 -m venv /opt/mq-sidecar
COPY pyproject.toml ./
# Dependencies first (from pyproject.toml's [project] dependencies; mypy, which compiles the
# core, from its test extra): this layer is rebuilt only when pyproject.toml changes, not on
# every source change.
RUN python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' \
        >/tmp/requirements.txt \
    && python3 -c 'import tomllib; print(*(r for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"] if r.startswith("mypy")), sep="\n")' \
        >/tmp/build-requirements.txt \
    && /opt/build/bin/pip install --quiet ${PIP_CA_BUNDLE:+--cert "$PIP_CA_BUNDLE"} "setuptools>=70.1" \
        --requirement /tmp/build-requirements.txt \
    && /opt/mq-sidecar/bin/pip install --quiet ${PIP_CA_BUNDLE:+--cert "$PIP_CA_BUNDLE"} \
        --requirement /tmp/requirements.txt
COPY . ./
# The wheel with the compiled core (no network: setuptools and mypy are already in the build
# venv), installed without touching the dependencies (pip check: they are all there); pip and
# setuptools leave the runtime venv; a smoke run that also fails the build if the compiled core
# does not load; the empty config file.
RUN MQ_SIDECAR_COMPILE=1 /opt/build/bin/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir /wheels . \
    && /opt/mq-sidecar/bin/pip install --quiet --no-deps /wheels/mq_sidecar-*.whl \
    && /opt/mq-sidecar/bin/pip check \
    && /opt/mq-sidecar/bin/pip uninstall --quiet --yes pip setuptools \
    && /opt/mq-sidecar/bin/mq-sidecar --version \
    && /opt/mq-sidecar/bin/python -I -c 'import sys, protocol._native as n; print(n.STATUS); sys.exit(not n.COMPILED)' \
    && mkdir -p /etc/mq-sidecar \
    && printf '%s\n' \
        '# mq-sidecar configuration (see config/examples/mq-sidecar.toml): no keys, all defaults.' \
        '# Mount your own file here, or set MQ_SIDECAR_<OPTION> environment variables.' \
        >/etc/mq-sidecar/mq-sidecar.toml

# --- runtime ---------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG VERSION=unknown
LABEL org.opencontainers.image.title="mq-sidecar" \
      org.opencontainers.image.description="STOMP sidecar that keeps apps connected to their brokers through failover" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 mq-sidecar \
    && useradd --uid 10001 --gid 10001 --no-log-init --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin mq-sidecar
COPY --from=build /opt/mq-sidecar /opt/mq-sidecar
COPY --from=build /etc/mq-sidecar /etc/mq-sidecar
ENV PATH=/opt/mq-sidecar/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MQ_SIDECAR_CONFIG=/etc/mq-sidecar/mq-sidecar.toml
USER 10001:10001
WORKDIR /
# STOMP for the app (loopback by default) and the HTTP admin plane (/metrics, /healthz, /readyz).
EXPOSE 61613 9464
# mq-sidecar drains on SIGTERM within drain_timeout (10 s by default).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=2)"]
ENTRYPOINT ["mq-sidecar"]
CMD ["run"]
