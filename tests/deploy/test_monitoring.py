"""Alerts and dashboard (issue 16, part 6): the rules file passes `promtool check rules` and its
unit tests (`promtool test rules`), every alert is tested firing; the dashboard is well formed
and every query parses; the chart's optional PrometheusRule and dashboard ConfigMap render the
same files, validated like the chart's other objects (tests/deploy/test_chart.py).

One source: the files live in the chart (helm/mq-sidecar/files/, which `.Files.Get` can read);
monitoring/alerts.yaml and monitoring/dashboard.json are symlinks to them. That every
dashboard query returns data from a real Prometheus that scraped a sidecar through a failover
is tests/integration/test_dashboard.py.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import (
    CHART,
    KUBERNETES_VERSIONS,
    REPO,
    YAMLLINT_CONFIG,
    Manifest,
    documents,
    find,
    helm,
    names,
    render,
    run,
    tool,
)

MONITORING = REPO / "monitoring"
ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
ALERTS_TEST = MONITORING / "alerts.test.yaml"
OPERATIONS_DOC = REPO / "docs" / "operations.md"

#: Both optional objects on, with labels for the operator's and Grafana's selectors.
ENABLED = (
    "--set", "monitoring.prometheusRule.enabled=true",
    "--set", "monitoring.prometheusRule.labels.release=prometheus",
    "--set", "monitoring.dashboard.enabled=true",
    "--set", "monitoring.dashboard.annotations.grafana_folder=Messaging",
)  # fmt: skip

#: Grafana's own variables the dashboard uses, with what they expand to in the checks here
#: (tests/integration/test_dashboard.py expands them as Grafana would for its query range).
GRAFANA_VARIABLES = ("$__rate_interval", "$__range")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool (Debian package prometheus): run scripts/setup.sh", pytrace=False)
    return path


# --- the dashboard's queries (also used by tests/integration/test_dashboard.py) ----------------


@dataclass(frozen=True)
class Query:
    """One query of the dashboard: a panel's target or a template variable's."""

    panel: str
    ref: str
    expr: str
    instant: bool = False

    @property
    def id(self) -> str:
        return f"{self.panel} [{self.ref}]"


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(board: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def panel_queries() -> list[Query]:
    return [
        Query(panel["title"], target["refId"], target["expr"], bool(target.get("instant")))
        for panel in panels(dashboard())
        for target in panel.get("targets", [])
    ]


def variable_queries() -> dict[str, str]:
    """Template variable -> its label_values() query (query variables only)."""
    return {
        v["name"]: v["query"]["query"]
        for v in dashboard()["templating"]["list"]
        if v["type"] == "query"
    }


def label_values(query: str) -> tuple[str, str]:
    """A ``label_values(selector, label)`` variable query as (label, selector)."""
    match = re.fullmatch(r"label_values\((.+), *([a-zA-Z_][a-zA-Z0-9_]*)\)", query)
    assert match, query
    return match[2], match[1]


def grafana_regex(values: list[str]) -> str:
    """A multi-value variable as Grafana's Prometheus data source writes it into a query:
    each value regex-escaped (the backslash doubled for the PromQL string), ``(a|b)``."""
    escaped = [re.sub(r"([\\$^*{}\[\]'+?.()|])", r"\\\\\1", v) for v in values]
    return "(" + "|".join(escaped) + ")"


def expand(expr: str, variables: Mapping[str, str]) -> str:
    """``expr`` with ``$name`` / ``${name}`` replaced from ``variables`` (longest names first,
    so ``$__rate_interval`` is not read as ``$__range``...); an unknown one is an error."""
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", variables[name]).replace("$" + name, variables[name])
    assert "$" not in expr, f"unknown variable in {expr!r}"
    return expr


def metric_names(expr: str) -> set[str]:
    """The mq_sidecar_* and process_* metric names an expression reads (histogram series
    named by their family: _bucket, _count and _sum dropped)."""
    found = set(re.findall(r"\b((?:mq_sidecar|process)_[a-z_]+)\b", expr))
    return {re.sub(r"_(bucket|count|sum)$", "", name) for name in found}


# --- the rules file ------------------------------------------------------------------------------


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(ALERTS.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def test_monitoring_files_are_the_charts() -> None:
    """monitoring/ holds links to the chart's files, not copies (Helm reads no file outside
    the chart, so the chart has the files and monitoring/ points at them)."""
    for name, target in (("alerts.yaml", ALERTS), ("dashboard.json", DASHBOARD)):
        link = MONITORING / name
        assert link.is_symlink(), f"{link} should be a symlink to {target}"
        assert link.resolve() == target.resolve()
        assert not target.is_symlink()


def test_promtool_check_rules() -> None:
    result = run([promtool(), "check", "rules", MONITORING / "alerts.yaml"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout, result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = run([promtool(), "test", "rules", ALERTS_TEST])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """Control: a wrong expectation fails promtool (the alerts really are compared)."""
    shutil.copy(ALERTS, tmp_path / "alerts.yaml")
    text = ALERTS_TEST.read_text()
    assert text.count("severity: critical") > 1
    (tmp_path / "t.yaml").write_text(text.replace("severity: critical", "severity: page", 1))
    result = run([promtool(), "test", "rules", tmp_path / "t.yaml"])
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_every_alert_is_tested_firing() -> None:
    """Each alert, at each of its severities, is expected firing in some unit test; each has
    a summary and a description."""
    wanted = {(r["alert"], r["labels"]["severity"]) for r in rules()}
    assert len({r["alert"] for r in rules()}) >= 9
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    fired = {
        (case["alertname"], alert["exp_labels"]["severity"])
        for test in tests
        for case in test.get("alert_rule_test", [])
        for alert in case["exp_alerts"]
    }
    assert wanted <= fired, f"never expected firing: {sorted(wanted - fired)}"
    for rule in rules():
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]


def documented_metrics() -> set[str]:
    """The metrics of docs/operations.md's metric tables (the first column of their rows)."""
    return set(re.findall(r"^\| `(mq_sidecar_[a-z_]+)`", OPERATIONS_DOC.read_text(), re.M))


@pytest.mark.parametrize("what", ["alerts", "dashboard"])
def test_only_documented_metrics(what: str) -> None:
    """Every metric an alert or a panel reads is in docs/operations.md's metric tables."""
    exprs = [r["expr"] for r in rules()] if what == "alerts" else [
        q.expr for q in panel_queries()
    ]  # fmt: skip
    used = set().union(*(metric_names(e) for e in exprs))
    known = documented_metrics()
    unknown = {m for m in used if m.startswith("mq_sidecar_") and m not in known}
    assert not unknown, f"not in docs/operations.md: {sorted(unknown)}"


def test_yamllint_monitoring_files() -> None:
    files = [ALERTS, ALERTS_TEST]
    result = run([tool("yamllint"), "--strict", "-c", YAMLLINT_CONFIG, "-f", "parsable", *files])
    assert result.returncode == 0, result.stdout + result.stderr


# --- the dashboard ------------------------------------------------------------------------------


def test_dashboard_is_well_formed() -> None:
    """What Grafana needs to import it through its sidecar: a fixed uid, no import-time
    inputs, unique panel ids, panels on the 24-column grid without overlaps, every query on
    the ${datasource} variable, each target with its own refId."""
    board = dashboard()
    assert board["uid"] == "mq-sidecar"
    assert board["title"] == "mq-sidecar"
    assert "__inputs" not in board
    assert "id" not in board or board["id"] is None
    all_panels = list(panels(board))
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells: dict[tuple[int, int], str] = {}
    for panel in all_panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[x, y]}"
                cells[x, y] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs, panel["title"]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
    variables = [v["name"] for v in board["templating"]["list"]]
    assert variables == ["datasource", "job", "instance"]
    datasource = board["templating"]["list"][0]
    assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")
    for name, query in variable_queries().items():
        assert query.startswith("label_values(mq_sidecar_build_info"), name


def test_dashboard_queries_use_the_sidecars_selector() -> None:
    """Every panel query selects its series by the $job and $instance variables (the
    dashboard shows the sidecars picked at the top, nothing else)."""
    for query in panel_queries():
        selectors = re.findall(r"\b[a-z_]+\{([^}]*)\}", query.expr)
        assert selectors, query.id
        for selector in selectors:
            assert 'job=~"$job"' in selector, query.id
            assert 'instance=~"$instance"' in selector, query.id


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Every query, variables expanded as Grafana would, passes Prometheus' own parser (as
    recording rules through `promtool check rules`)."""
    variables = {
        "job": grafana_regex(["mq-sidecar"]),
        "instance": grafana_regex(["10.0.0.1:9464", "10.0.0.2:9464"]),
        "__rate_interval": "1m",
        "__range": "21600s",
    }
    exprs = [expand(q.expr, variables) for q in panel_queries()]
    for query in variable_queries().values():
        label, selector = label_values(expand(query, variables))
        exprs.append(f"group by ({label}) ({selector})")
    assert len(exprs) >= 30
    records = [{"record": f"dashboard:query_{n}", "expr": expr} for n, expr in enumerate(exprs)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    result = run([promtool(), "check", "rules", path])
    assert result.returncode == 0, result.stdout + result.stderr


def test_expand_writes_what_grafana_writes() -> None:
    assert grafana_regex(["127.0.0.1:9464"]) == r"(127\\.0\\.0\\.1:9464)"
    assert (
        expand('up{job=~"$job"}[$__rate_interval]', {"job": "(a|b)", "__rate_interval": "4s"})
        == 'up{job=~"(a|b)"}[4s]'
    )
    with pytest.raises(AssertionError, match="unknown variable"):
        expand("up[$__interval]", {"__rate_interval": "4s"})


# --- the chart -----------------------------------------------------------------------------------


@functools.cache
def rendered_enabled() -> str:
    return render(*ENABLED)


def enabled_docs() -> list[Manifest]:
    return documents(rendered_enabled())


def test_monitoring_objects_are_off_by_default() -> None:
    kinds = {d["kind"] for d in documents(render())}
    assert "PrometheusRule" not in kinds
    assert not [n for n in names(documents(render())) if n.endswith("-dashboard")]


def test_monitoring_objects_render_when_enabled() -> None:
    default = set(names(documents(render())))
    assert set(names(enabled_docs())) == default | {
        "PrometheusRule/rel-mq-sidecar-alerts",
        "ConfigMap/rel-mq-sidecar-dashboard",
    }


def test_helm_lint_strict_with_monitoring() -> None:
    result = helm("lint", "--strict", CHART, *ENABLED)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("k8s", KUBERNETES_VERSIONS)
def test_kubernetes_validate_strict_with_monitoring(k8s: str, tmp_path: Path) -> None:
    """Every object, the dashboard ConfigMap among them, passes kubernetes-validate --strict;
    the PrometheusRule (a CRD: no schema there) is checked by promtool below instead."""
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(rendered_enabled())
    result = run([tool("kubernetes-validate"), "--strict", "--kubernetes-version", k8s, manifest])
    assert result.returncode == 0, result.stdout + result.stderr
    crds = [d for d in enabled_docs() if d["kind"] in ("ServiceMonitor", "PrometheusRule")]
    assert result.stdout.count("passed for resource") == len(enabled_docs()) - len(crds)
    assert "Couldn't find schema for kind PrometheusRule" in result.stdout + result.stderr


def test_yamllint_rendered_with_monitoring(tmp_path: Path) -> None:
    """The rendered objects pass yamllint as in test_chart.py; the dashboard ConfigMap too,
    but for the length of its lines: they are the dashboard's JSON, as long as its queries
    (its content is compared with the file in test_dashboard_configmap_for_the_grafana_sidecar)."""
    json_lines = tmp_path / "yamllint-json-lines.yaml"
    json_lines.write_text(f"extends: {YAMLLINT_CONFIG}\nrules:\n  line-length: disable\n")
    texts = rendered_enabled().split("\n---\n")
    dashboards = [t for t in texts if "-dashboard\n" in t and "mq-sidecar.json: |-" in t]
    assert len(dashboards) == 1
    for text, config in (
        ("\n---\n".join(t for t in texts if t not in dashboards), YAMLLINT_CONFIG),
        ("---\n" + dashboards[0], json_lines),
    ):
        result = run(
            [tool("yamllint"), "--strict", "-c", config, "-f", "parsable", "-"],
            input=text.rstrip("\n") + "\n",
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_prometheusrule_carries_the_rules_file(tmp_path: Path) -> None:
    """The PrometheusRule's spec is the rules file, and its rules pass promtool's check and
    the unit tests as they come out of the chart (Prometheus Operator's admission webhook
    parses rules with the same code)."""
    rule = find(enabled_docs(), "PrometheusRule", "-alerts")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "shop"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    allowed = {"alert", "expr", "for", "labels", "annotations"}
    for group in rule["spec"]["groups"]:
        assert set(group) == {"name", "rules"}
        for r in group["rules"]:
            assert set(r) <= allowed, r["alert"]
            assert all(
                isinstance(v, str) for v in [*r["labels"].values(), *r["annotations"].values()]
            )
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rule["spec"]))
    shutil.copy(ALERTS_TEST, tmp_path / "alerts.test.yaml")
    for command in (["check", "rules", "alerts.yaml"], ["test", "rules", "alerts.test.yaml"]):
        result = run([promtool(), *command], cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr


def test_rule_labels_reach_every_alert_but_not_over_severity() -> None:
    docs = documents(
        render(
            "--set", "monitoring.prometheusRule.enabled=true",
            "--set", "monitoring.prometheusRule.ruleLabels.team=orders",
            "--set", "monitoring.prometheusRule.ruleLabels.severity=info",
        )
    )  # fmt: skip
    spec = find(docs, "PrometheusRule", "-alerts")["spec"]
    chart_rules = [r for g in spec["groups"] for r in g["rules"]]
    assert len(chart_rules) == len(rules())
    for ours, theirs in zip(rules(), chart_rules, strict=True):
        assert theirs["labels"] == {**ours["labels"], "team": "orders"}, ours["alert"]


def test_dashboard_configmap_for_the_grafana_sidecar() -> None:
    cm = find(enabled_docs(), "ConfigMap", "-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Messaging"}
    assert cm["metadata"]["namespace"] == "shop"
    assert list(cm["data"]) == ["mq-sidecar.json"]
    assert json.loads(cm["data"]["mq-sidecar.json"]) == dashboard()
    # kubectl apply keeps a copy in an annotation of at most 256 KiB.
    assert len(cm["data"]["mq-sidecar.json"]) < 256 * 1024
    other = documents(
        render(
            "--set", "monitoring.dashboard.enabled=true",
            "--set", "monitoring.dashboard.namespace=grafana",
            "--set", "monitoring.dashboard.labels.grafana_dashboard=null",
            "--set", "monitoring.dashboard.labels.dashboards=mq",
        )
    )  # fmt: skip
    cm = find(other, "ConfigMap", "-dashboard")
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["dashboards"] == "mq"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert "annotations" not in cm["metadata"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "monitoring.prometheusRule.enabled=yes"),
            "at '/monitoring/prometheusRule/enabled': got string, want boolean",
        ),
        (
            ("--set", "monitoring.prometheusRule.selector=x"),
            "at '/monitoring/prometheusRule': additional properties 'selector' not allowed",
        ),
        (
            ("--set", "monitoring.prometheusRule.ruleLabels.team-name=orders"),
            "invalid propertyName 'team-name'",
        ),
        (
            ("--set-json", 'monitoring.dashboard.labels={"grafana_dashboard":1}'),
            "at '/monitoring/dashboard/labels/grafana_dashboard': got number, want string",
        ),
        (
            ("--set", "monitoring.dashboard.namespace=Grafana"),
            "at '/monitoring/dashboard/namespace': 'Grafana' does not match pattern",
        ),
    ],
    ids=["enabled-type", "unknown-key", "rule-label-name", "label-value-type", "namespace"],
)
def test_schema_rejects_bad_monitoring_values(args: tuple[str, ...], message: str) -> None:
    result = helm("template", "rel", CHART, *args)
    assert result.returncode != 0, f"helm template accepted {args}"
    output = result.stdout + result.stderr
    assert "don't meet the specifications of the schema" in output, output
    assert message in output, output
