"""The Grafana dashboard against real data (issue 16, part 6): a real Prometheus scrapes a real
sidecar in front of a real ActiveMQ while the sidecar fails over, then every query of
monitoring/dashboard.json — each panel's targets and the template variables — is evaluated
through Prometheus' HTTP API, with the variables expanded as Grafana expands them, and must
return data with at least one finite value; the failover itself must show on the panels
meant to show it.

The outbox's panels (those reading ``mq_sidecar_outbox_*``) are checked the same way against
a second sidecar, in outbox mode (its gauges have no sample otherwise): frames stored while the
broker refuses, some of them expired (``outbox_max_age``), the rest forwarded once it is back.

The failover: the first broker is the ActiveMQ's plain STOMP port behind a fault proxy, the
second its stomp+ssl port (so the TLS certificate panel has a certificate to show); the proxy
refuses and resets, the session fails over to the TLS listener. One ActiveMQ (about 1.5 s to
start) serves both addresses; to the sidecar they are two brokers.
"""

from __future__ import annotations

import datetime
import json
import math
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import trustme

from testbed import ActiveMQ, write_server_files
from tests.conftest import _require_activemq
from tests.deploy.test_monitoring import (
    Query,
    expand,
    grafana_regex,
    label_values,
    metric_names,
    panel_queries,
    rules,
    variable_queries,
)
from tests.faultproxy import FaultProxy
from tests.integration.support import (
    Client,
    RawClient,
    SidecarThread,
    client,
    sidecar_config,
    unique,
    wait_until,
)
from tests.integration.test_admin import (
    Address,
    admin_address,
    http_get,
    prometheus,
    scraped_value,
)
from tests.integration.test_failover import FAST, next_event, subscribe_events

pytestmark = [pytest.mark.activemq, pytest.mark.timeout(300)]

#: test_admin.prometheus scrapes every second; Grafana's $__rate_interval for a 1 s step is
#: max($__interval + scrape interval, 4 x scrape interval) = 4 s.
STEP_S = 1
RATE_INTERVAL = "4s"
#: The TLS listener's certificate expires this many days after the test starts.
CERT_DAYS = 100


@dataclass
class Scraped:
    """A Prometheus that scraped a sidecar through a failover, still running."""

    prom: Address
    start: float
    end: float
    first: str  # broker labels: the proxied plain port, the TLS port
    second: str

    def variables(self) -> dict[str, str]:
        """Grafana's expansion of every variable the panels use ("All" selected)."""
        values = {"__rate_interval": RATE_INTERVAL, "__range": f"{round(self.end - self.start)}s"}
        for name, query in variable_queries().items():  # job first, then instance
            values[name] = grafana_regex(self.label_values(expand(query, values)))
        return values

    def label_values(self, query: str) -> list[str]:
        """What Grafana asks Prometheus for a ``label_values(selector, label)`` variable."""
        label, selector = label_values(query)
        params = {"match[]": selector, "start": self.start, "end": self.end}
        return [str(v) for v in self._api(f"/api/v1/label/{label}/values", params)]

    def evaluate(self, expr: str, *, instant: bool) -> list[tuple[dict[str, str], list[float]]]:
        """Each series of ``expr`` (labels, values): its value at the end (instant), or its
        values over the whole run at STEP_S."""
        if instant:
            result = self._api("/api/v1/query", {"query": expr, "time": self.end})
            return [(s["metric"], [float(s["value"][1])]) for s in result["result"]]
        params = {"query": expr, "start": self.start, "end": self.end, "step": STEP_S}
        result = self._api("/api/v1/query_range", params)
        return [(s["metric"], [float(v) for _, v in s["values"]]) for s in result["result"]]

    def _api(self, path: str, params: Mapping[str, object]) -> Any:
        status, _, body = http_get(self.prom, f"{path}?{urllib.parse.urlencode(params)}")
        answer = json.loads(body)
        assert status == 200, answer
        return answer["data"]


def traffic(app: Client, dest: str, tag: str, n: int = 5) -> None:
    """``n`` persistent SENDs with receipts, each received by the app's own subscription."""
    for i in range(n):
        app.conn.send(dest, f"{tag} {i}", headers={"receipt": f"{tag}-{i}", "persistent": "true"})
        app.receipt(f"{tag}-{i}")
    assert [m.body for m in app.messages(n)] == [f"{tag} {i}" for i in range(n)]


def reads_the_outbox(query: Query) -> bool:
    """Whether ``query`` reads an outbox metric (checked against the outbox-mode sidecar)."""
    return any(name.startswith("mq_sidecar_outbox_") for name in metric_names(query.expr))


#: Frames stored and left to expire, then stored and forwarded, by the outbox sidecar.
EXPIRED, FORWARDED = 3, 5


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    _require_activemq()
    tmp = tmp_path_factory.mktemp("dashboard")
    not_after = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=CERT_DAYS)
    listener = write_server_files(trustme.CA(), tmp / "tls", not_after=not_after)
    assert listener.server_ca is not None
    with (
        ActiveMQ("dashboard", tmp / "amq", tls=listener) as broker,
        FaultProxy((broker.host, broker.stomp_port)) as proxy,
    ):
        first, second = f"127.0.0.1:{proxy.port}", f"127.0.0.1:{broker.tls_port}"
        config = sidecar_config(
            f"failover:(stomp://{first},stomp+ssl://{second})",
            tls_ca_file=str(listener.server_ca),
            broker_probe_interval=200,
            **FAST,
        )
        with (
            SidecarThread(config) as sidecar,
            prometheus(tmp / "prometheus", admin_address(sidecar)) as prom,
            client(sidecar.address) as app,
        ):
            start = time.time()
            subscribe_events(app)
            dest = unique()
            app.conn.subscribe(destination=dest, id="d", ack="auto", headers={"receipt": "d"})
            app.receipt("d")
            traffic(app, dest, "before")
            # Scraped with the traffic and the TLS listener's certificate (from the probes).
            scraped_value(prom, "mq_sidecar_sessions_accepted_total", 1)
            scraped_value(prom, "count(mq_sidecar_upstream_tls_cert_expiry_seconds)", 1)
            scraped_value(prom, 'sum(mq_sidecar_relayed_frames_total{command="SEND"})', 5)
            proxy.refuse(True)
            proxy.reset()
            next_event(app, "FAILOVER", to_broker=second)
            traffic(app, dest, "after")
            scraped_value(prom, "sum(mq_sidecar_failovers_total)", 1)
            scraped_value(prom, 'sum(mq_sidecar_relayed_frames_total{command="SEND"})', 10)
            time.sleep(3 * STEP_S)  # a few scrapes after the failover, for the rate windows
            end = time.time()
            yield Scraped(prom, start, end, first, second)


@pytest.fixture(scope="module")
def scraped_outbox(
    tmp_path_factory: pytest.TempPathFactory, activemq: ActiveMQ
) -> Iterator[Scraped]:
    """A real Prometheus scraping a sidecar in outbox mode (``outbox_max_age`` 1.5 s) in front
    of the shared ActiveMQ behind a fault proxy: EXPIRED frames stored while the proxy refuses,
    left to expire; FORWARDED more stored, then the proxy lets the sidecar through and they
    are forwarded."""
    tmp = tmp_path_factory.mktemp("dashboard-outbox")
    with FaultProxy((activemq.host, activemq.stomp_port)) as proxy:
        proxy.refuse(True)
        broker = f"127.0.0.1:{proxy.port}"
        config = sidecar_config(
            f"stomp://{broker}",
            outbox="true",
            outbox_dir=str(tmp / "ob"),
            outbox_max_age=1500,
            broker_probe_interval=200,
            **FAST,
        )
        with (
            SidecarThread(config) as sidecar,
            prometheus(tmp / "prometheus", admin_address(sidecar)) as prom,
        ):
            start = time.time()
            app = RawClient(sidecar.address)
            app.connect(**{"heart-beat": "0,0"})  # answered by the sidecar: no broker
            dest = unique("/queue/dashboard-outbox")

            def store(tag: str, n: int) -> None:
                for i in range(n):
                    receipt = f"{tag}-{i}"
                    app.send_frame("SEND", {"destination": dest, "receipt": receipt}, b"x")
                    assert app.frame().get("receipt-id") == receipt

            scraped_value(prom, "mq_sidecar_outbox_frames", 0)  # scraped from now on
            store("old", EXPIRED)
            scraped_value(prom, "max_over_time(mq_sidecar_outbox_frames[1m])", EXPIRED)
            scraped_value(prom, "mq_sidecar_outbox_expired_total", EXPIRED)
            store("new", FORWARDED)
            scraped_value(prom, "max_over_time(mq_sidecar_outbox_oldest_age_seconds[1m])", 0.5)
            proxy.refuse(False)
            scraped_value(prom, "mq_sidecar_outbox_forwarded_total", FORWARDED)
            wait_until(lambda: sidecar.status()["outbox"]["frames"] == 0)
            time.sleep(3 * STEP_S)  # a few scrapes after, for the rate windows
            end = time.time()
            app.close()
            yield Scraped(prom, start, end, broker, broker)


def check_returns_data(scraped: Scraped, query: Query) -> None:
    expr = expand(query.expr, scraped.variables())
    series = scraped.evaluate(expr, instant=query.instant)
    assert series, f"no data: {expr}"
    values = [v for _, vs in series for v in vs]
    assert any(math.isfinite(v) for v in values), f"only NaN/Inf: {expr}"


@pytest.mark.parametrize(
    "query", [q for q in panel_queries() if not reads_the_outbox(q)], ids=lambda q: q.id
)
def test_panel_query_returns_data(scraped: Scraped, query: Query) -> None:
    check_returns_data(scraped, query)


@pytest.mark.parametrize(
    "query", [q for q in panel_queries() if reads_the_outbox(q)], ids=lambda q: q.id
)
def test_outbox_panel_query_returns_data(scraped_outbox: Scraped, query: Query) -> None:
    check_returns_data(scraped_outbox, query)


def test_the_outbox_shows_on_the_dashboard(scraped_outbox: Scraped) -> None:
    """The outbox panels show what happened: the depth rose to EXPIRED + FORWARDED at most and
    ended at 0, the oldest frame aged and ended at 0, frames were forwarded and expired at
    some rate, recovery found nothing; on the same data the only outbox alert condition that
    holds is MQSidecarOutboxExpired's."""
    variables = scraped_outbox.variables()

    def series(title: str, ref: str = "A") -> list[float]:
        (query,) = [q for q in panel_queries() if (q.panel, q.ref) == (title, ref)]
        expr = expand(query.expr, variables)
        ((_, values),) = scraped_outbox.evaluate(expr, instant=query.instant)
        return values

    depth = series("Outbox depth")
    assert 0 < max(depth) <= EXPIRED + FORWARDED, depth
    assert depth[-1] == 0
    age = series("Oldest outbox frame")
    assert max(age) > 0.5, age
    assert age[-1] == 0
    assert max(series("Outbox forwarded and expired", "A")) > 0
    assert max(series("Outbox forwarded and expired", "B")) > 0
    assert series("Outbox recovery problems") == [0.0]
    holding = {
        rule["alert"]
        for rule in rules()
        if rule["alert"].startswith("MQSidecarOutbox")
        and scraped_outbox.evaluate(rule["expr"], instant=True)
    }
    assert holding == {"MQSidecarOutboxExpired"}, holding


def test_variables_list_the_sidecar(scraped: Scraped) -> None:
    """The job and instance drop-downs list the scraped sidecar (test_admin's job name)."""
    status, _, body = http_get(scraped.prom, "/api/v1/targets")
    assert status == 200
    (target,) = json.loads(body)["data"]["activeTargets"]
    job = scraped.label_values("label_values(mq_sidecar_build_info, job)")
    assert job == [target["labels"]["job"]] == ["mq-sidecar"]
    variables = scraped.variables()
    assert variables["job"] == "(mq-sidecar)"
    instance = target["labels"]["instance"]
    assert variables["instance"] == grafana_regex([instance])


def test_the_failover_shows_on_the_dashboard(scraped: Scraped) -> None:
    """The panels meant to show a failover show this one: the route and reason in the
    failovers table, a failed_over outage with its duration, the session on the second
    broker, the second broker's certificate CERT_DAYS out."""
    variables = scraped.variables()

    def panel(title: str, ref: str = "A") -> str:
        (query,) = [q for q in panel_queries() if (q.panel, q.ref) == (title, ref)]
        return expand(query.expr, variables)

    def last(title: str) -> dict[tuple[str, ...], float]:
        return {tuple(s.values()): vs[-1] for s, vs in scraped.evaluate(panel(title), instant=True)}

    table = scraped.evaluate(panel("Failovers since each sidecar started"), instant=True)
    assert table == [
        (
            {
                "from_broker": scraped.first,
                "to_broker": scraped.second,
                "reason": "connection_lost",
            },
            [1.0],
        )
    ]
    outages = {
        s["outcome"]: max(vs)
        for s, vs in scraped.evaluate(panel("Outages by how they ended"), instant=False)
    }
    assert outages["failed_over"] > 0, outages
    assert outages["disconnected"] == 0, outages
    durations = [
        v for _, vs in scraped.evaluate(panel("Outage duration"), instant=False) for v in vs
    ]
    assert any(0 < v < 30 for v in durations), durations
    assert last("Upstream legs per broker") == {(scraped.first,): 0.0, (scraped.second,): 1.0}
    days = last("Broker TLS certificate expiry")
    assert list(days) == [(scraped.second,)]
    assert CERT_DAYS - 1 < days[scraped.second,] <= CERT_DAYS, days


def test_alert_conditions_after_the_failover(scraped: Scraped) -> None:
    """The alert rules' expressions (monitoring/alerts.yaml) on the same real data: each one
    runs, and the only condition that holds is MQSidecarBrokerUnreachable's, for the first
    broker (it answered, now it refuses; its `for: 10m` has not passed)."""
    holding: dict[str, list[dict[str, str]]] = {}
    for rule in rules():
        series = scraped.evaluate(rule["expr"], instant=True)
        if series:
            holding.setdefault(rule["alert"], []).extend(labels for labels, _ in series)
    assert set(holding) == {"MQSidecarBrokerUnreachable"}, holding
    (labels,) = holding["MQSidecarBrokerUnreachable"]
    assert (labels["job"], labels["broker"]) == ("mq-sidecar", scraped.first)
