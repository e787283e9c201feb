"""The Helm chart (helm/mq-sidecar): lint, render, validate, and run its config through the CLI.

Three value sets are rendered: the defaults, helm/examples/values-production.yaml (every
option under `config` set, existing broker Secret, chart-made client Secret, mutual TLS from a
Secret, an admin token that /metrics needs too, plain-container sidecar, ServiceMonitor) and a
third one ("plain-container": a chart-made broker Secret, a list of broker URLs, an image
digest, only a CA from the TLS Secret, an admin token for /status and /events only, no Spark
template), and a fourth ("outbox-pvc": the outbox on a claim the chart makes, with its
destinations and bound; no Spark template, which a claim cannot serve).
"""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from config import OPTIONS
from proxy.session.session import DRAIN_GOODBYE_MAX
from testbed import ActiveMQ, free_port, wait_stomp
from tests.deploy.support import (
    ADMIN_TOKEN_MOUNT,
    CHART,
    CONFIG_FILE,
    CONFIG_MOUNT,
    EXAMPLES,
    KUBERNETES_VERSIONS,
    PRODUCTION_VALUES,
    REPO,
    TLS_MOUNT,
    YAMLLINT_CONFIG,
    Manifest,
    clean_environ,
    config_toml,
    container_env,
    documents,
    executor_pod,
    find,
    helm,
    names,
    pod_specs,
    render,
    run,
    sidecar,
    tool,
)

CASES: dict[str, tuple[str, ...]] = {
    "default": (),
    "production": ("--values", str(PRODUCTION_VALUES)),
    "plain-container": (
        "--set", "sidecar.native=false",
        "--set", "credentials.login=orders",
        "--set", "credentials.passcode=not-a-real-passcode",
        "--set-json", 'config.brokers=["stomp://a.mq:61613","stomp://b.mq:61613?host=/"]',
        "--set", "config.drain_timeout=4500",
        "--set", "image.digest=sha256:" + "0" * 64,
        "--set", "sparkExecutor.enabled=false",
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "tls.existingSecret=broker-ca",
        "--set", "tls.certKey=",
        "--set", "tls.keyKey=",
        "--set", "tls.serverName=broker.messaging.example",
        "--set", "tls.minVersion=1.3",
        "--set", "admin.tokenSecret.name=mq-admin",
        "--set", "admin.tokenSecret.key=bearer",
        "--set", "maxSessions=200",
    ),
    "outbox-pvc": (
        "--set", "outbox.enabled=true",
        "--set-json", 'outbox.destinations=["/queue/orders.*","/topic/audit"]',
        "--set", "outbox.maxBytes=536870912",
        "--set", "outbox.maxAge=3600000",
        "--set", "outbox.volume.type=pvc",
        "--set", "outbox.volume.size=1Gi",
        "--set", "outbox.volume.storageClassName=local-ssd",
        "--set", "sparkExecutor.enabled=false",
    ),
}  # fmt: skip

#: What each case renders (kind/name), the list for the report and docs/deploy.md.
EXPECTED_OBJECTS = {
    "default": {
        "ConfigMap/rel-mq-sidecar-config",
        "ConfigMap/rel-mq-sidecar-spark-executor-pod-template",
        "Service/rel-mq-sidecar-metrics",
        "Deployment/rel-mq-sidecar-example",
    },
    "production": {
        "ConfigMap/rel-mq-sidecar-config",
        "ConfigMap/rel-mq-sidecar-spark-executor-pod-template",
        "Secret/rel-mq-sidecar-client-credentials",
        "Service/rel-mq-sidecar-metrics",
        "ServiceMonitor/rel-mq-sidecar-metrics",
        "Deployment/rel-mq-sidecar-example",
    },
    "plain-container": {
        "ConfigMap/rel-mq-sidecar-config",
        "Secret/rel-mq-sidecar-broker-credentials",
        "Service/rel-mq-sidecar-metrics",
        "ServiceMonitor/rel-mq-sidecar-metrics",
        "Deployment/rel-mq-sidecar-example",
    },
    "outbox-pvc": {
        "ConfigMap/rel-mq-sidecar-config",
        "PersistentVolumeClaim/rel-mq-sidecar-outbox",
        "Service/rel-mq-sidecar-metrics",
        "Deployment/rel-mq-sidecar-example",
    },
}

#: Options that are deliberately not under `config`: listen/admin_listen come from
#: sidecar.ports (STOMP stays on loopback), credentials come from Secrets.
NOT_IN_CONFIG = {"listen", "admin_listen", "login", "passcode", "client_login", "client_passcode"}

#: Options the chart sets from its own values instead (option -> value): the *_file options
#: point into the mounts of the Secrets (a key of tls.existingSecret, admin.tokenSecret).
FROM_CHART_VALUES = {
    "tls_ca_file": "tls.caKey",
    "tls_cert_file": "tls.certKey",
    "tls_key_file": "tls.keyKey",
    "tls_key_password_file": "tls.keyPasswordKey",
    "tls_verify_hostname": "tls.verifyHostname",
    "tls_server_name": "tls.serverName",
    "tls_min_version": "tls.minVersion",
    "tls_ciphers": "tls.ciphers",
    "admin_token_file": "admin.tokenSecret",
    "admin_token_metrics": "admin.tokenForMetrics",
    "max_sessions": "maxSessions",
    "outbox": "outbox.enabled",
    "outbox_dir": "outbox.volume",
    "outbox_destinations": "outbox.destinations",
    "outbox_max_bytes": "outbox.maxBytes",
    "outbox_max_age": "outbox.maxAge",
}

#: Secret volumes of the sidecar container: volume name -> mount path.
SECRET_MOUNTS = {"mq-sidecar-tls": TLS_MOUNT, "mq-sidecar-admin-token": ADMIN_TOKEN_MOUNT}

#: The *_file options of each case's config -> (Secret, key) whose file they name.
EXPECTED_SECRET_FILES: dict[str, dict[str, tuple[str, str]]] = {
    "default": {},
    "production": {
        "tls_ca_file": ("orders-mq-client-tls", "ca.crt"),
        "tls_cert_file": ("orders-mq-client-tls", "tls.crt"),
        "tls_key_file": ("orders-mq-client-tls", "tls.key"),
        "admin_token_file": ("orders-mq-sidecar-admin", "token"),
    },
    "plain-container": {
        "tls_ca_file": ("broker-ca", "ca.crt"),
        "admin_token_file": ("mq-admin", "bearer"),
    },
    "outbox-pvc": {},
}

case_ids = pytest.mark.parametrize("case", list(CASES))


@functools.cache
def rendered(case: str) -> str:
    return render(*CASES[case])


def docs_of(case: str) -> list[Manifest]:
    return documents(rendered(case))


# --- lint and schema --------------------------------------------------------------------------


@case_ids
def test_helm_lint_strict(case: str) -> None:
    result = helm("lint", "--strict", CHART, *CASES[case])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@case_ids
def test_renders_the_expected_objects(case: str) -> None:
    assert set(names(docs_of(case))) == EXPECTED_OBJECTS[case]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "config.drain_timeout=ten"),
            "at '/config/drain_timeout': got string, want integer",
        ),
        (
            ("--set", "config.retry_intervall=100"),
            "at '/config': additional properties 'retry_intervall' not allowed",
        ),
        (
            ("--set", "config.passcode=hunter2"),
            "at '/config': additional properties 'passcode' not allowed",
        ),
        (
            ("--set", "config.listen=0.0.0.0:61613"),
            "at '/config': additional properties 'listen' not allowed",
        ),
        (
            ("--set", "sidecar.ports.admin=70000"),
            "at '/sidecar/ports/admin': maximum: got 70,000, want 65,535",
        ),
        (("--set-json", "config.jitter=1.5"), "at '/config/jitter': maximum: got 1.5, want 1"),
        (
            ("--set", "config.log_level=loud"),
            "at '/config/log_level': value must be one of 'debug', 'info', 'warning', 'error'",
        ),
        (("--set-json", "config.upstream_heartbeat=[5000]"), "at '/config/upstream_heartbeat'"),
        (
            ("--set", "image.pullPolicy=Sometimes"),
            "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'",
        ),
        (
            ("--set", "tls.minVersion=1.1"),
            "at '/tls/minVersion': value must be one of '1.2', '1.3'",
        ),
        (
            # A number (minVersion: 1.3 unquoted in a values file) is not the string "1.3".
            ("--set-json", "tls.minVersion=1.3"),
            "at '/tls/minVersion': value must be one of '1.2', '1.3'",
        ),
        (
            ("--set", "tls.verifyHostname=maybe"),
            "at '/tls/verifyHostname': got string, want boolean",
        ),
        (
            ("--set", "tls.caKey=certs/ca.crt"),
            "at '/tls/caKey': 'certs/ca.crt' does not match pattern",
        ),
        (
            ("--set", "tls.serverName=10.0.0.1:61614"),
            "at '/tls/serverName': '10.0.0.1:61614' does not match pattern",
        ),
        (
            ("--set", "admin.tokenSecret.key="),
            "at '/admin/tokenSecret/key': '' does not match pattern",
        ),
        (
            ("--set", "admin.tokenForMetrics=yes"),
            "at '/admin/tokenForMetrics': got string, want boolean",
        ),
        (("--set", "maxSessions=0"), "at '/maxSessions': minimum: got 0, want 1"),
        (
            ("--set", "tls.certFile=/etc/ssl/client.pem"),
            "at '/tls': additional properties 'certFile' not allowed",
        ),
    ],
    ids=[
        "type",
        "unknown-option",
        "credential-in-configmap",
        "listen-not-configurable",
        "port-range",
        "fraction-range",
        "enum",
        "heartbeat-pair",
        "pull-policy",
        "tls-min-version",
        "tls-min-version-number",
        "tls-verify-hostname-type",
        "tls-key-name",
        "tls-server-name",
        "admin-token-key",
        "admin-token-metrics-type",
        "max-sessions",
        "tls-unknown-value",
    ],
)
def test_schema_rejects_bad_values(args: tuple[str, ...], message: str) -> None:
    for command in (("template", "rel"), ("lint", "--strict")):
        result = helm(*command, CHART, *args)
        assert result.returncode != 0, f"helm {command[0]} accepted {args}"
        output = result.stdout + result.stderr
        assert "don't meet the specifications of the schema" in output, output
        assert message in output, output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "sidecar.terminationGracePeriodSeconds=12"),
            "sidecar.terminationGracePeriodSeconds: 12 is too short: mq-sidecar needs "
            "shutdownDelaySeconds (5) + drain_timeout (10000 ms, rounded up to 10 s) + 5 s "
            "margin = 20 s",
        ),
        (
            ("--set", "config.brokers=failover:(stomp://a:61613\\,stomp://app:pw@b:61613)"),
            'config.brokers: "failover:(stomp://a:61613,stomp://***@b:61613)" has credentials '
            "in it (user:password@)",
        ),
        (
            ("--set", "credentials.login=orders"),
            "credentials: give both login and passcode (or credentials.existingSecret)",
        ),
        (
            ("--set", "sidecar.ports.admin=61613"),
            "sidecar.ports: stomp and admin are both 61613",
        ),
        (
            ("--set", "tls.existingSecret=broker-tls", "--set", "tls.keyKey="),
            "tls: certKey is set but keyKey is empty: a client certificate needs its key",
        ),
        (
            ("--set", "tls.existingSecret=broker-tls", "--set", "tls.certKey="),
            "tls: keyKey is set but certKey is empty: a key needs its client certificate",
        ),
        (
            (
                "--set",
                "tls.existingSecret=broker-tls",
                "--set",
                "tls.certKey=",
                "--set",
                "tls.keyKey=",
                "--set",
                "tls.keyPasswordKey=password",
            ),
            "tls: keyPasswordKey is set but keyKey is empty: a key password needs the key",
        ),
        (
            (
                "--set",
                "tls.existingSecret=broker-tls",
                "--set",
                "tls.caKey=",
                "--set",
                "tls.certKey=",
                "--set",
                "tls.keyKey=",
            ),
            'tls.existingSecret "broker-tls": caKey, certKey and keyKey are all empty, '
            "nothing to mount",
        ),
        (
            ("--set", "admin.tokenForMetrics=true"),
            "admin.tokenForMetrics: /metrics would need a token, but admin.tokenSecret.name "
            "is empty",
        ),
    ],
    ids=[
        "grace-period",
        "credentials-in-url",
        "half-credentials",
        "same-ports",
        "tls-cert-without-key",
        "tls-key-without-cert",
        "tls-password-without-key",
        "tls-nothing-to-mount",
        "metrics-token-without-token",
    ],
)
def test_templates_refuse_inconsistent_values(args: tuple[str, ...], message: str) -> None:
    result = helm("template", "rel", CHART, *args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "pw" not in result.stderr.replace("pwd", "")


def test_schema_config_matches_the_option_table() -> None:
    """Every mq-sidecar option (config/_options.py) but listen/admin_listen/credentials and
    those set from the chart's own values (FROM_CHART_VALUES) has a schema entry of the right
    type under `config`, and nothing else does: a new option must be added to
    values.schema.json (it would be refused as an unknown key otherwise)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    props: dict[str, Any] = schema["properties"]["config"]["properties"]
    wanted = set(OPTIONS) - NOT_IN_CONFIG - set(FROM_CHART_VALUES)
    assert set(OPTIONS) >= NOT_IN_CONFIG | set(FROM_CHART_VALUES)
    assert not NOT_IN_CONFIG & set(FROM_CHART_VALUES)
    assert set(props) == wanted, (
        f"values.schema.json config: missing {sorted(wanted - set(props))}, "
        f"unknown {sorted(set(props) - wanted)}"
    )
    json_types = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}
    for name in sorted(wanted):
        option, entry = OPTIONS[name], props[name]
        if option.kind in json_types:
            assert entry["type"] == json_types[option.kind], name
        elif option.kind == "enum":
            assert entry["enum"] == list(option.choices), name
        else:
            assert "oneOf" in entry, f"{name} ({option.kind}) should accept several forms"


def _at(tree: dict[str, Any], dotted: str, *, schema: bool = False) -> Any:
    """The entry at a dotted values path, in values.yaml or (schema=True) in the schema."""
    for part in dotted.split("."):
        tree = tree["properties"][part] if schema else tree[part]
    return tree


def test_chart_values_match_their_options() -> None:
    """The values that set options outside `config` (FROM_CHART_VALUES) exist in the schema,
    with the option's type (or, for the *_file options, a Secret key), and their defaults in
    values.yaml are the program's own ("", null: unset or the program's default)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    json_types = {"int": "integer", "bool": "boolean", "str": "string"}
    for name, path in sorted(FROM_CHART_VALUES.items()):
        option, entry, default = OPTIONS[name], _at(schema, path, schema=True), _at(values, path)
        if name == "admin_token_file":
            assert set(entry["required"]) == {"name", "key"}
            assert default["name"] == ""
            continue
        if name == "outbox_dir":  # the volume's mount
            assert entry["properties"]["type"]["enum"] == ["emptyDir", "pvc"]
            assert default["type"] == "emptyDir"
            continue
        if option.kind == "strings":
            assert {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "minLength": 1},
            } in (entry["oneOf"]), name
            assert default is None, name
            continue
        if name.endswith("_file"):
            assert entry["type"] == "string", name
            assert entry["pattern"] == "^[-._a-zA-Z0-9]*$", name  # a Secret key, or ""
            continue
        if option.kind == "enum":
            assert entry["enum"] == list(option.choices), name
        else:
            types = entry["type"] if isinstance(entry["type"], list) else [entry["type"]]
            assert json_types[option.kind] in types, name
        if option.default is None:
            assert default == "", name
        else:
            assert default in (option.default, None), name
    assert {"tls", "admin", "outbox"} <= set(schema["required"])


# --- rendered manifests ------------------------------------------------------------------------


@case_ids
@pytest.mark.parametrize("k8s", KUBERNETES_VERSIONS)
def test_kubernetes_validate_strict(case: str, k8s: str, tmp_path: Path) -> None:
    """Every rendered object, and the executor pod template (given a dummy name: Spark names
    the pods), passes kubernetes-validate --strict. ServiceMonitor has no schema there (a CRD):
    it is only reported as not validated."""
    docs = docs_of(case)
    pods = []
    if any(d["metadata"]["name"].endswith("-spark-executor-pod-template") for d in docs):
        pod = executor_pod(docs)
        pod["metadata"]["name"] = "spark-executor-dummy"
        pods.append(pod)
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(rendered(case) + "---\n" + yaml.safe_dump_all(pods))
    result = run([tool("kubernetes-validate"), "--strict", "--kubernetes-version", k8s, manifest])
    assert result.returncode == 0, result.stdout + result.stderr
    crds = [d for d in docs if d["kind"] == "ServiceMonitor"]
    passed = result.stdout.count("passed for resource")
    assert passed == len(docs) - len(crds) + len(pods), result.stdout
    if crds:
        assert "Couldn't find schema for kind ServiceMonitor" in result.stdout + result.stderr


def test_kubernetes_validate_catches_an_unknown_field(tmp_path: Path) -> None:
    """Control: the validator used above does reject a bad manifest (--strict)."""
    manifest = tmp_path / "bad.yaml"
    # The last occurrence is in the Deployment (earlier ones are inside the executor
    # template, a string in a ConfigMap).
    head, _, tail = rendered("default").rpartition("imagePullPolicy: IfNotPresent")
    manifest.write_text(head + "imagePullPolicyy: IfNotPresent" + tail)
    result = run([tool("kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSIONS[-1], manifest])
    assert result.returncode != 0
    assert "imagePullPolicyy" in result.stdout + result.stderr


@case_ids
def test_yamllint_rendered(case: str) -> None:
    yamllint = tool("yamllint")
    texts = {"rendered": rendered(case)}
    if any(n.endswith("-spark-executor-pod-template") for n in names(docs_of(case))):
        cm = find(docs_of(case), "ConfigMap", "-spark-executor-pod-template")
        texts["executor pod template"] = "---\n" + cm["data"]["executor-pod-template.yaml"]
    for what, text in texts.items():
        result = run(
            [yamllint, "--strict", "-c", YAMLLINT_CONFIG, "-f", "parsable", "-"], input=text
        )
        assert result.returncode == 0, f"{what}:\n{result.stdout}{result.stderr}"


def test_yamllint_chart_sources() -> None:
    files = [CHART / "Chart.yaml", CHART / "values.yaml", *sorted(EXAMPLES.glob("*.yaml"))]
    result = run([tool("yamllint"), "--strict", "-c", YAMLLINT_CONFIG, "-f", "parsable", *files])
    assert result.returncode == 0, result.stdout + result.stderr


@case_ids
def test_configmap_accepted_by_check_config(case: str, tmp_path: Path) -> None:
    """The rendered config file, with the environment the sidecar container gets (Secrets
    resolved, an existingSecret replaced by dummies), passes the real `mq-sidecar
    check-config`, run the way the container runs `mq-sidecar run`."""
    docs = docs_of(case)
    configmap = find(docs, "ConfigMap", "-config")
    config_file = tmp_path / "mq-sidecar.toml"
    config_file.write_text(config_toml(docs))
    for where, spec in pod_specs(docs):
        container = sidecar(spec)
        assert container["args"] == ["run", "--config", CONFIG_FILE], where
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "mq-sidecar-config"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert mount["mountPath"] == CONFIG_MOUNT
        assert volume["configMap"]["name"] == configmap["metadata"]["name"]

        env = container_env(container, docs)
        args = ["check-config", *container["args"][1:]]
        args[args.index(CONFIG_FILE)] = str(config_file)
        result = run([tool("mq-sidecar"), *args], env={**clean_environ(), **env})
        assert result.returncode == 0, f"{where}: {result.stderr}"
        assert "configuration OK" in result.stderr
        assert "ignoring unknown environment variables" not in result.stderr
        shown = json.loads(result.stdout)
        assert shown["listen"] == "127.0.0.1:61613"
        assert shown["admin_listen"] == "0.0.0.0:9464"
        for key, value in tomllib.loads(config_file.read_text()).items():
            expected = value
            if key.endswith("_heartbeat") and isinstance(value, str):
                expected = [int(v) for v in value.split(",")]
            if key not in ("brokers", "listen", "admin_listen"):
                assert shown[key] == expected, key
        for name in ("login", "passcode", "client_login", "client_passcode"):
            if f"MQ_SIDECAR_{name.upper()}" in env:
                assert shown[name] == "***", name
                assert env[f"MQ_SIDECAR_{name.upper()}"] not in result.stdout + result.stderr


@case_ids
def test_pods_wire_the_sidecar(case: str) -> None:
    """Placement, probes, ports, hardening, resources, grace period and where the
    credentials go, in every pod that runs the sidecar."""
    docs = docs_of(case)
    config = tomllib.loads(config_toml(docs))
    drain_s = math.ceil(config.get("drain_timeout", OPTIONS["drain_timeout"].default) / 1000)
    secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    specs = list(pod_specs(docs))
    assert specs
    for where, spec in specs:
        assert spec["enableServiceLinks"] is False, where
        container = sidecar(spec)
        native = container in spec.get("initContainers", [])
        if native:
            assert container["restartPolicy"] == "Always"
            assert "lifecycle" not in container
            delay = 5
        else:
            assert "restartPolicy" not in container
            delay = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert spec["terminationGracePeriodSeconds"] >= delay + drain_s + 5, where

        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
            "stomp": 61613,
            "admin": 9464,
        }
        # Open endpoints, no admin token (no httpHeaders), even when one is configured.
        probes = {
            k: container[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")
        }
        assert probes == {
            "startupProbe": {"path": "/healthz", "port": "admin"},
            "livenessProbe": {"path": "/healthz", "port": "admin"},
            "readinessProbe": {"path": "/readyz", "port": "admin"},
        }
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True
        assert sc["runAsUser"] == 10001
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert set(container["resources"]) == {"requests", "limits"}

        # Broker credentials: in the sidecar's environment only; the app's containers get
        # where to connect (and the client credentials, if any), never MQ_SIDECAR_* values.
        others = [
            c for c in [*spec.get("initContainers", []), *spec["containers"]] if c is not container
        ]
        assert others
        for other in others:
            assert "envFrom" not in other
            env = {e["name"]: e for e in other.get("env", [])}
            assert not [n for n in env if n.startswith("MQ_SIDECAR_")], other["name"]
            assert env["STOMP_HOST"]["value"] == "127.0.0.1"
            assert env["STOMP_PORT"]["value"] == "61613"
        sidecar_env = {e["name"]: e for e in container.get("env", [])}
        if "MQ_SIDECAR_LOGIN" in sidecar_env:
            broker_secret = sidecar_env["MQ_SIDECAR_LOGIN"]["valueFrom"]["secretKeyRef"]["name"]
            for other in others:
                assert broker_secret not in json.dumps(other), other["name"]
            assert broker_secret not in json.dumps(spec.get("volumes", []))
            assert broker_secret in secrets or case == "production"
        assert "envFrom" not in container
        assert "shareProcessNamespace" not in spec  # the app must not see the sidecar's env


@case_ids
def test_secret_files_reach_the_sidecar_only(case: str) -> None:
    """The TLS and admin token Secrets are volumes only the sidecar container mounts,
    read-only, as directories (a subPath mount never sees a rotated Secret); every *_file
    option in the config names a file of those mounts, from the expected Secret and key; no
    other container (app, Spark executor) mounts them or names the Secrets."""
    docs = docs_of(case)
    config = tomllib.loads(config_toml(docs))
    files = {k: v for k, v in config.items() if k.endswith("_file")}
    expected = EXPECTED_SECRET_FILES[case]
    assert set(files) == set(expected)
    for where, spec in pod_specs(docs):
        container = sidecar(spec)
        secrets = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
        assert set(secrets) <= set(SECRET_MOUNTS), where
        assert [m for m in container["volumeMounts"] if m["name"] in secrets] == [
            {"name": name, "mountPath": SECRET_MOUNTS[name], "readOnly": True}
            for name in SECRET_MOUNTS
            if name in secrets
        ], where
        provided = {
            f"{SECRET_MOUNTS[name]}/{item['path']}": (secret["secretName"], item["key"])
            for name, secret in secrets.items()
            for item in secret["items"]
        }
        assert {option: provided[path] for option, path in files.items()} == expected, where
        assert len(provided) == len(files), f"{where}: a mounted file no option uses"

        others = [
            c for c in [*spec.get("initContainers", []), *spec["containers"]] if c is not container
        ]
        assert others
        for other in others:
            mounts = [m["name"] for m in other.get("volumeMounts", [])]
            assert not set(mounts) & set(secrets), f"{where}: {other['name']} mounts {mounts}"
            for secret in secrets.values():
                assert secret["secretName"] not in json.dumps(other), other["name"]


def test_no_secret_volumes_when_the_features_are_off() -> None:
    """Without tls.existingSecret and admin.tokenSecret (the defaults; TLS settings alone do
    not need a Secret), the pods have the config volume only and the config no *_file or
    admin_token option; the ServiceMonitor sends no token."""
    off = documents(
        render(
            "--set", "tls.verifyHostname=false",
            "--set", "tls.minVersion=1.3",
            "--set", "tls.keyPasswordKey=password",
            "--set", "admin.tokenSecret.key=bearer",
            "--set", "metrics.serviceMonitor.enabled=true",
        )
    )  # fmt: skip
    for docs in (docs_of("default"), off):
        specs = list(pod_specs(docs))
        assert len(specs) == 2
        for where, spec in specs:
            assert [v["name"] for v in spec["volumes"]] == ["mq-sidecar-config"], where
            assert [m["name"] for m in sidecar(spec)["volumeMounts"]] == ["mq-sidecar-config"]
        config = tomllib.loads(config_toml(docs))
        assert not [k for k in config if k.endswith("_file") or k.startswith("admin_token")]
    config = tomllib.loads(config_toml(off))
    assert config["tls_verify_hostname"] is False
    assert config["tls_min_version"] == "1.3"
    (endpoint,) = find(off, "ServiceMonitor")["spec"]["endpoints"]
    assert "authorization" not in endpoint


def test_every_tls_value_reaches_the_config() -> None:
    """All TLS values at once, with the Secret's keys renamed and a key password: each file
    lands under its fixed name in the TLS mount, and each value sets its option."""
    docs = documents(
        render(
            "--set", "tls.existingSecret=orders-client",
            "--set", "tls.caKey=issuer.pem",
            "--set", "tls.certKey=client.pem",
            "--set", "tls.keyKey=client-key.pem",
            "--set", "tls.keyPasswordKey=client-key.password",
            "--set", "tls.verifyHostname=false",
            "--set", "tls.serverName=artemis.messaging.example",
            "--set", "tls.minVersion=1.3",
            "--set", "tls.ciphers=ECDHE+AESGCM",
            "--set", "admin.tokenSecret.name=orders-admin",
            "--set", "admin.tokenForMetrics=true",
            "--set", "maxSessions=64",
        )
    )  # fmt: skip
    config = tomllib.loads(config_toml(docs))
    assert {k: v for k, v in config.items() if k in FROM_CHART_VALUES} == {
        "tls_ca_file": f"{TLS_MOUNT}/ca.crt",
        "tls_cert_file": f"{TLS_MOUNT}/tls.crt",
        "tls_key_file": f"{TLS_MOUNT}/tls.key",
        "tls_key_password_file": f"{TLS_MOUNT}/key-password",
        "tls_verify_hostname": False,
        "tls_server_name": "artemis.messaging.example",
        "tls_min_version": "1.3",
        "tls_ciphers": "ECDHE+AESGCM",
        "admin_token_file": f"{ADMIN_TOKEN_MOUNT}/token",
        "admin_token_metrics": True,
        "max_sessions": 64,
    }
    for where, spec in pod_specs(docs):
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["mq-sidecar-tls"]["secret"] == {
            "secretName": "orders-client",
            "items": [
                {"key": "issuer.pem", "path": "ca.crt"},
                {"key": "client.pem", "path": "tls.crt"},
                {"key": "client-key.pem", "path": "tls.key"},
                {"key": "client-key.password", "path": "key-password"},
            ],
        }, where
        assert volumes["mq-sidecar-admin-token"]["secret"] == {
            "secretName": "orders-admin",
            "items": [{"key": "token", "path": "token"}],
        }, where


def test_example_app_gets_no_api_token() -> None:
    deployment = find(docs_of("default"), "Deployment", "-example")
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


@case_ids
def test_metrics_service_selects_the_sidecar_pods(case: str) -> None:
    docs = docs_of(case)
    service = find(docs, "Service", "-metrics")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9464, "targetPort": 9464, "protocol": "TCP"}
    ]
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9464"
    assert annotations["prometheus.io/path"] == "/metrics"
    selector = service["spec"]["selector"].items()
    pod_labels = [
        d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] == "Deployment"
    ]
    if any(n.endswith("-spark-executor-pod-template") for n in names(docs)):
        pod_labels.append(executor_pod(docs)["metadata"]["labels"])
    assert pod_labels
    for labels in pod_labels:
        assert selector <= labels.items()
    config = tomllib.loads(config_toml(docs))
    assert config.get("admin_token_metrics", False) is (case == "production")
    for monitor in [d for d in docs if d["kind"] == "ServiceMonitor"]:
        assert (
            monitor["spec"]["selector"]["matchLabels"].items()
            <= service["metadata"]["labels"].items()
        )
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == "metrics"
        assert endpoint["path"] == "/metrics"
        # /metrics behind the admin token: Prometheus sends it, from the sidecars' Secret.
        if config.get("admin_token_metrics"):
            _, spec = next(pod_specs(docs))
            (token,) = [v for v in spec["volumes"] if v["name"] == "mq-sidecar-admin-token"]
            assert endpoint["authorization"] == {
                "type": "Bearer",
                "credentials": {
                    "name": token["secret"]["secretName"],
                    "key": token["secret"]["items"][0]["key"],
                },
            }
        else:
            assert "authorization" not in endpoint


# --- the outbox's volume (docs/deploy.md, "The outbox volume") --------------------------------

OUTBOX_MOUNT = "/var/lib/mq-sidecar/outbox"


def _outbox_of(docs: list[Manifest]) -> list[tuple[str, Manifest, Manifest]]:
    """(where, the outbox volume, the sidecar's mount of it) of every pod; only the sidecar
    container mounts it."""
    found = []
    for where, spec in pod_specs(docs):
        container = sidecar(spec)
        (volume,) = [v for v in spec["volumes"] if v["name"] == "mq-sidecar-outbox"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "mq-sidecar-outbox"]
        others = [
            c for c in [*spec.get("initContainers", []), *spec["containers"]] if c is not container
        ]
        assert others
        for other in others:
            assert "mq-sidecar-outbox" not in json.dumps(other), f"{where}: {other['name']}"
        found.append((where, volume, mount))
    return found


def test_outbox_on_an_empty_dir_by_default() -> None:
    """outbox.enabled alone: an emptyDir (no sizeLimit) mounted read-write into the sidecar
    container only, in the example app and the Spark executors alike; the config says
    outbox = true and outbox_dir = the mount, and nothing else of the outbox."""
    docs = documents(render("--set", "outbox.enabled=true"))
    config = tomllib.loads(config_toml(docs))
    assert {k: v for k, v in config.items() if k.startswith("outbox")} == {
        "outbox": True,
        "outbox_dir": OUTBOX_MOUNT,
    }
    found = _outbox_of(docs)
    assert len(found) == 2  # the example app and the executor template
    for where, volume, mount in found:
        assert volume == {"name": "mq-sidecar-outbox", "emptyDir": {}}, where
        assert mount == {"name": "mq-sidecar-outbox", "mountPath": OUTBOX_MOUNT}, where
    assert "PersistentVolumeClaim" not in [d["kind"] for d in docs]
    deployment = find(docs, "Deployment", "-example")["spec"]
    assert "strategy" not in deployment  # a new pod has its own emptyDir
    assert "fsGroup" not in deployment["template"]["spec"]["securityContext"]
    limited = documents(
        render("--set", "outbox.enabled=true", "--set", "outbox.volume.sizeLimit=3Gi")
    )
    for where, volume, _ in _outbox_of(limited):
        assert volume["emptyDir"] == {"sizeLimit": "3Gi"}, where


def test_outbox_on_a_claim_the_chart_makes() -> None:
    docs = docs_of("outbox-pvc")
    config = tomllib.loads(config_toml(docs))
    assert {k: v for k, v in config.items() if k.startswith("outbox")} == {
        "outbox": True,
        "outbox_dir": OUTBOX_MOUNT,
        "outbox_destinations": ["/queue/orders.*", "/topic/audit"],
        "outbox_max_bytes": 536870912,
        "outbox_max_age": 3600000,
    }
    claim = find(docs, "PersistentVolumeClaim", "-outbox")
    assert claim["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "local-ssd",
        "resources": {"requests": {"storage": "1Gi"}},
    }
    ((where, volume, mount),) = _outbox_of(docs)
    assert volume["persistentVolumeClaim"] == {"claimName": "rel-mq-sidecar-outbox"}, where
    assert mount == {"name": "mq-sidecar-outbox", "mountPath": OUTBOX_MOUNT}
    deployment = find(docs, "Deployment", "-example")["spec"]
    # One pod per claim: the old pod lets go of it before the new one starts; the claim's
    # root directory is made writable for the sidecar's group.
    assert deployment["strategy"] == {"type": "Recreate"}
    security = deployment["template"]["spec"]["securityContext"]
    assert security["fsGroup"] == 10001
    assert security["fsGroupChangePolicy"] == "OnRootMismatch"
    assert security["runAsNonRoot"] is True  # podSecurityContext's own values stay


def test_outbox_on_an_existing_claim() -> None:
    docs = documents(
        render(
            "--set", "outbox.enabled=true",
            "--set", "outbox.volume.type=pvc",
            "--set", "outbox.volume.existingClaim=orders-outbox-0",
            "--set", "outbox.volume.size=1Mi",  # not the chart's claim: not checked
            "--set", "outbox.volume.accessMode=ReadWriteOncePod",
            "--set", "sparkExecutor.enabled=false",
            "--set-json", 'podSecurityContext={"fsGroup": 2000}',
        )
    )  # fmt: skip
    assert "PersistentVolumeClaim" not in [d["kind"] for d in docs]
    ((_, volume, _),) = _outbox_of(docs)
    assert volume["persistentVolumeClaim"] == {"claimName": "orders-outbox-0"}
    spec = find(docs, "Deployment", "-example")["spec"]["template"]["spec"]
    assert spec["securityContext"]["fsGroup"] == 2000  # a given fsGroup wins
    assert "fsGroupChangePolicy" not in spec["securityContext"]


def test_outbox_claim_options() -> None:
    docs = documents(
        render(
            "--set", "outbox.enabled=true",
            "--set", "outbox.volume.type=pvc",
            "--set", "outbox.volume.keep=false",
            "--set", "outbox.volume.storageClassName=",
            "--set", "outbox.volume.accessMode=ReadWriteOncePod",
            "--set", "sparkExecutor.enabled=false",
        )
    )  # fmt: skip
    claim = find(docs, "PersistentVolumeClaim", "-outbox")
    assert "annotations" not in claim["metadata"]
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOncePod"],
        "storageClassName": "",  # "" = no class (a pre-bound volume); null = the default
        "resources": {"requests": {"storage": "2Gi"}},
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "outbox.volume.sizeLimit=1Gi"),
            "outbox.volume.sizeLimit: 1Gi is less than 2 x outbox.maxBytes (1073741824 bytes)",
        ),
        (
            (
                "--set", "outbox.volume.type=pvc",
                "--set", "outbox.volume.size=900Mi",
                "--set", "outbox.maxBytes=500000000",
                "--set", "sparkExecutor.enabled=false",
            ),
            "outbox.volume.size: 900Mi is less than 2 x outbox.maxBytes (500000000 bytes)",
        ),
        (
            ("--set", "outbox.volume.type=pvc"),
            "sparkExecutor.enabled: every executor made from the template would mount the "
            "outbox's one claim",
        ),
        (
            (
                "--set", "outbox.volume.type=pvc",
                "--set", "exampleApp.replicas=2",
                "--set", "sparkExecutor.enabled=false",
            ),
            "exampleApp.replicas: 2 pods cannot share the outbox's claim rel-mq-sidecar-outbox",
        ),
    ],
    ids=["empty-dir-too-small", "claim-too-small", "claim-and-spark", "claim-and-replicas"],
)  # fmt: skip
def test_outbox_templates_refuse(args: tuple[str, ...], message: str) -> None:
    result = helm("template", "rel", CHART, "--set", "outbox.enabled=true", *args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "config.outbox_dir=/data"),
            "at '/config': additional properties 'outbox_dir' not allowed",
        ),
        (
            ("--set", "outbox.volume.type=hostPath"),
            "at '/outbox/volume/type': value must be one of 'emptyDir', 'pvc'",
        ),
        (("--set", "outbox.volume.size=lots"), "at '/outbox/volume/size'"),
        (("--set", "outbox.maxBytes=0"), "at '/outbox/maxBytes': minimum: got 0, want 1"),
        (
            ("--set", "outbox.volume.accessMode=ReadWriteMany"),
            "at '/outbox/volume/accessMode'",
        ),
        (("--set-json", "outbox.destinations=[]"), "at '/outbox/destinations'"),
    ],
    ids=["dir-not-configurable", "volume-type", "size", "max-bytes", "access-mode", "no-patterns"],
)
def test_outbox_schema_refuses(args: tuple[str, ...], message: str) -> None:
    result = helm("template", "rel", CHART, *args)
    assert result.returncode != 0, f"helm template accepted {args}"
    output = result.stdout + result.stderr
    assert "don't meet the specifications of the schema" in output, output
    assert message in output, output


def test_executor_pod_template_for_spark() -> None:
    """Spark picks the executor container by name (podTemplateContainerName) and keeps the
    template's init containers and volumes."""
    pod = executor_pod(docs_of("default"))
    assert "name" not in pod["metadata"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["spark-kubernetes-executor"]
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["mq-sidecar"]
    cm = find(docs_of("default"), "ConfigMap", "-spark-executor-pod-template")
    assert list(cm["data"]) == ["executor-pod-template.yaml"]
    production = executor_pod(docs_of("production"))
    assert production["spec"]["containers"][0]["name"] == "executor"
    assert production["metadata"]["labels"]["spark-pipeline"] == "orders"


def test_long_release_names_fit_dns_labels() -> None:
    release = "a-release-name-of-53-characters-the-most-helm-allows0"
    docs = documents(render(release=release))
    for doc in docs:
        if doc["kind"] in ("Service", "Deployment"):
            assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]
        for value in doc["metadata"]["labels"].values():
            assert len(value) <= 63


PARENT_DEPLOYMENT = """\
{{- $mq := dict "root" (index .Subcharts "mq-sidecar") }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-shop
spec:
  selector:
    matchLabels:
      app: shop
  template:
    metadata:
      labels:
        app: shop
        {{- include "mq-sidecar.selectorLabels" $mq | nindent 8 }}
      annotations:
        {{- include "mq-sidecar.podAnnotations" $mq | nindent 8 }}
    spec:
      enableServiceLinks: false
      terminationGracePeriodSeconds: {{ include "mq-sidecar.terminationGracePeriodSeconds" $mq }}
      {{- if $mq.root.Values.sidecar.native }}
      initContainers:
        {{- include "mq-sidecar.container" $mq | nindent 8 }}
      {{- end }}
      containers:
        - name: shop
          image: shop:1.2.3
          env:
            {{- include "mq-sidecar.appEnv" $mq | nindent 12 }}
        {{- if not $mq.root.Values.sidecar.native }}
        {{- include "mq-sidecar.container" $mq | nindent 8 }}
        {{- end }}
      volumes:
        {{- include "mq-sidecar.volumes" $mq | nindent 8 }}
"""

PARENT_VALUES = """\
mq-sidecar:
  exampleApp:
    enabled: false
  sparkExecutor:
    enabled: false
  config:
    brokers: stomp://activemq.shop.svc:61613
  credentials:
    existingSecret: shop-broker-login
  tls:
    existingSecret: shop-broker-ca
    certKey: ""
    keyKey: ""
"""


def _injection_snippet() -> str:
    """The usage example in the comment at the top of templates/_sidecar.tpl, dedented."""
    lines = (CHART / "templates" / "_sidecar.tpl").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "$mq := dict" in line)
    end = lines.index("", start)
    return textwrap.dedent("\n".join(lines[start:end]))


def test_docs_show_the_charts_injection_snippet() -> None:
    """docs/deploy.md shows the chart's own snippet, and the parent chart rendered below uses
    every named template the snippet includes."""
    snippet = _injection_snippet()
    assert f"```yaml\n{snippet}\n```" in (REPO / "docs" / "deploy.md").read_text()
    included = set(re.findall(r'include "(mq-sidecar\.[A-Za-z]+)"', snippet))
    assert included <= set(re.findall(r'include "(mq-sidecar\.[A-Za-z]+)"', PARENT_DEPLOYMENT))
    assert "mq-sidecar.container" in included


@pytest.mark.parametrize("native", [True, False], ids=["native", "plain-container"])
def test_another_chart_injects_the_sidecar(native: bool, tmp_path: Path) -> None:
    """The injection snippet (the comment at the top of templates/_sidecar.tpl, shown in
    docs/deploy.md), in a chart that has this one under charts/."""
    parent = tmp_path / "shop"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "mq-sidecar")
    (parent / "Chart.yaml").write_text(
        'apiVersion: v2\nname: shop\nversion: 1.2.3\nappVersion: "1.2.3"\n'
    )
    (parent / "values.yaml").write_text(PARENT_VALUES)
    (parent / "templates" / "deployment.yaml").write_text(PARENT_DEPLOYMENT)
    text = render(
        "--set", f"mq-sidecar.sidecar.native={str(native).lower()}", chart=parent, release="web"
    )
    docs = documents(text)
    assert set(names(docs)) == {
        "ConfigMap/web-mq-sidecar-config",
        "Service/web-mq-sidecar-metrics",
        "Deployment/web-shop",
    }
    spec = find(docs, "Deployment", "-shop")["spec"]["template"]["spec"]
    container = sidecar(spec)
    assert container["image"] == "mq-sidecar:0.1.0"  # the dependency's appVersion
    assert (container in spec.get("initContainers", [])) is native
    assert container["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "shop-broker-login"
    assert spec["volumes"] == [
        {"name": "mq-sidecar-config", "configMap": {"name": "web-mq-sidecar-config"}},
        {
            "name": "mq-sidecar-tls",
            "secret": {
                "secretName": "shop-broker-ca",
                "items": [{"key": "ca.crt", "path": "ca.crt"}],
            },
        },
    ]
    (shop,) = [c for c in spec["containers"] if c["name"] == "shop"]
    assert "volumeMounts" not in shop
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/etc/mq-sidecar", TLS_MOUNT]
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(text)
    result = run([tool("kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSIONS[-1], manifest])
    assert result.returncode == 0, result.stdout + result.stderr


@case_ids
def test_install_dry_run_renders_the_notes(case: str) -> None:
    result = helm("install", "rel", CHART, "--dry-run=client", "--namespace", "shop", *CASES[case])
    assert result.returncode == 0, result.stderr
    assert "NOTES:\nmq-sidecar" in result.stdout
    assert "127.0.0.1:61613" in result.stdout


def test_example_app_talks_through_the_sidecar(activemq: ActiveMQ) -> None:
    """The example app's STOMP loop (the Deployment's command and env) against a real
    mq-sidecar and ActiveMQ: CONNECTED, then a RECEIPT per message."""
    deployment = find(docs_of("default"), "Deployment", "-example")
    app = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "app"
    )
    stomp, admin = free_port(), free_port()
    env = {e["name"]: e["value"] for e in app["env"]}
    env.update({"STOMP_PORT": str(stomp), "SEND_INTERVAL_SECONDS": "0.2"})
    daemon = subprocess.Popen(
        [
            tool("mq-sidecar"), "run",
            "--listen", f"127.0.0.1:{stomp}",
            "--admin-listen", f"127.0.0.1:{admin}",
            "--brokers", activemq.stomp_url,
        ],
        env=clean_environ(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_stomp("127.0.0.1", stomp, timeout=30)
        command = [sys.executable if c == "python3" else c for c in app["command"]]
        loop = subprocess.Popen(
            command,
            env={**clean_environ(), **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            out, _ = loop.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            loop.kill()
            out, _ = loop.communicate()
        lines = out.splitlines()
        assert lines[0] == "CONNECTED", out
        assert lines[1] == "message 1: RECEIPT", out
        assert "message 3: RECEIPT" in lines, out
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=30)


# --- the drain on SIGTERM -----------------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("drain_ms", [10_000, 4_500, 60_000])
def test_the_app_outlives_nothing_it_needs_and_the_drain_fits_the_grace_period(
    native: bool, drain_ms: int
) -> None:
    """How the chart keeps the app's last frames safe (docs/deploy.md, "Shutdown order"):

    - native sidecar (an init container with ``restartPolicy: Always``): the kubelet sends it
      SIGTERM only once the app container has exited (KEP-753), so the app's last frames and
      their RECEIPTs go through a sidecar that is not draining; the sidecar has no preStop
      hook (one would run at the start of the pod's termination, beside the app's);
    - plain container: every container gets SIGTERM at once, so the sidecar's preStop sleeps
      ``shutdownDelaySeconds`` first (the app closes its sessions), then it drains while the
      app, still running, gets the receipts of what was in flight;
    - either way the termination grace period covers that delay, ``drain_timeout`` and what a
      session may take past the drain's deadline (``DRAIN_GOODBYE_MAX``: its report, the
      DISCONNECT's receipt, the app's ERROR), so the kubelet kills neither container (SIGKILL)
      before the sidecar has handed the app what it could.
    """
    args = (
        *("--set", f"sidecar.native={str(native).lower()}"),
        *("--set", f"config.drain_timeout={drain_ms}"),
    )
    docs = documents(render(*args))
    assert tomllib.loads(config_toml(docs))["drain_timeout"] == drain_ms
    specs = list(pod_specs(docs))
    assert len(specs) == 2  # the example Deployment and the Spark executor template
    for where, spec in specs:
        container = sidecar(spec)
        apps = [c for c in spec["containers"] if c is not container]
        assert apps, where
        if native:
            assert container in spec["initContainers"], where
            assert container["restartPolicy"] == "Always", where
            assert "lifecycle" not in container, where
            delay = 5  # sidecar.shutdownDelaySeconds: the app's own shutdown, before ours
        else:
            assert container in spec["containers"], where
            assert "restartPolicy" not in container, where
            delay = container["lifecycle"]["preStop"]["sleep"]["seconds"]
            assert delay == 5, where
        for app in apps:  # nothing delays the app's SIGTERM or kills it early
            assert "lifecycle" not in app, where
        grace = spec["terminationGracePeriodSeconds"]
        assert grace >= delay + drain_ms / 1000 + DRAIN_GOODBYE_MAX, where
        assert grace == delay + math.ceil(drain_ms / 1000) + 5, where


# -- the memory budget (max_memory_bytes, docs/behaviour.md "One memory budget") --------------

MEMORY_BASE = ("--set", "config.brokers=stomp://mq:61613")


@pytest.mark.parametrize(
    ("args", "budget"),
    [
        ((), 384 * 1024 * 1024),  # the default 512Mi limit, less 128 MiB: the program's default
        (("--set", "sidecar.resources.limits.memory=1Gi"), 1024 * 1024 * 1024 - 128 * 1024 * 1024),
        (("--set", "sidecar.resources.limits.memory=0.75Gi"), 640 * 1024 * 1024),
        (
            (
                "--set",
                "sidecar.resources.limits.memory=192Mi",
                "--set",
                "config.max_frame_bytes=16777216",
            ),
            64 * 1024 * 1024,
        ),
        (("--set", "config.max_memory_bytes=123456789"), 123456789),  # given: kept as it is
        (("--set", "sidecar.resources.limits.memory=null"), None),  # no limit: program default
    ],
)
def test_the_memory_budget_is_derived_from_the_memory_limit(
    args: tuple[str, ...], budget: int | None
) -> None:
    text = config_toml(documents(render(*MEMORY_BASE, *args)))
    assert text.count("max_memory_bytes") == (budget is not None)
    assert tomllib.loads(text).get("max_memory_bytes") == budget


def test_a_memory_limit_too_small_for_one_frame_is_refused_with_the_reason() -> None:
    result = helm(
        "template", "rel", CHART, *MEMORY_BASE, "--set", "sidecar.resources.limits.memory=256Mi"
    )
    assert result.returncode != 0
    assert (
        "sidecar.resources.limits.memory: 256Mi leaves max_memory_bytes 134217728 (the limit "
        "less 128 MiB for the process), below what one frame of max_frame_bytes (150994944) "
        "needs, 302055424 (twice its size and 64 KiB): raise the limit to at least 436273152 "
        "bytes, or set config.max_frame_bytes lower"
    ) in result.stderr
