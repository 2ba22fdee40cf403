"""The chart's Grafana dashboard: every query parses and names only metrics the operator exports.

The exported names come from a real :class:`prescaler.metrics.Metrics` registry, the PromQL
from a real parser (``promql-parser``), so a renamed or dropped metric, or a query that no
longer parses, fails here instead of leaving an empty panel.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import promql_parser as pp
import pytest
from prometheus_client.metrics import MetricWrapperBase

from cluster.grafana import DASHBOARD, LABEL_VALUES, MACROS, panels, queries, substitute
from prescaler.capacity import ROLES
from prescaler.controller.model import fleet_label
from prescaler.metrics import Metrics

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
POOL_SCOPE = {"namespace": "$namespace", "pool": "$pool"}

# Sample names a metric family of each type exposes (prometheus_client, text format).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
}


# ---------------------------------------------------------------------- what is exported
def exported_metrics(metrics: Metrics) -> dict[str, tuple[str, ...]]:
    """Every sample name the registry can expose, with its label names."""
    labels_of = {
        wrapper._name: tuple(wrapper._labelnames)  # private: no public accessor
        for wrapper in vars(metrics).values()
        if isinstance(wrapper, MetricWrapperBase)
    }
    names: dict[str, tuple[str, ...]] = {}
    for family in metrics.registry.collect():
        suffixes = _SUFFIXES[family.type]  # a new type fails here, not silently
        labels = labels_of.get(family.name, ())
        for suffix in suffixes:
            extra = ("le",) if suffix == "_bucket" else ()
            names[family.name + suffix] = (*labels, *extra)
    return names


# ---------------------------------------------------------------------- what is queried
def selectors(expr: str) -> list[pp.VectorSelector]:
    """The vector selectors of a Grafana PromQL query (``$__rate_interval`` and friends
    become a duration; any other ``$variable`` must sit inside a label value's string)."""
    found: list[pp.VectorSelector] = []

    def visit(node: pp.Expr) -> None:
        if isinstance(node, pp.VectorSelector):
            found.append(node)

    pp.walk(pp.parse(MACROS.sub("5m", expr)), visit)
    return found


def metric_name(selector: pp.VectorSelector) -> str | None:
    if selector.name:
        return selector.name
    for matcher in selector.matchers.matchers:
        if matcher.name == "__name__" and matcher.op == pp.MatchOp.Equal:
            return matcher.value
    return None


def _equal(selector: pp.VectorSelector) -> dict[str, str]:
    return {m.name: m.value for m in selector.matchers.matchers if m.op == pp.MatchOp.Equal}


def whole_pool(expr: str) -> list[str]:
    """The selectors (as text) a query reads for the whole pool of the one selected: the
    left side of ``X and on (namespace, pool) label_replace(S, "pool", ...)``, ``S`` a
    selector scoped to ``$pool``. ``label_replace`` turns a role's ``pool`` label into its
    pool's (``<pool>/prefill`` into ``<pool>``; a unified pool's stays), so ``X`` is kept
    for the selected pool or for the disaggregated pool the selected role belongs to."""
    found: list[str] = []

    def scoped(node: pp.Expr) -> bool:
        return isinstance(node, pp.VectorSelector) and all(
            _equal(node).get(label) == value for label, value in POOL_SCOPE.items()
        )

    def visit(node: pp.Expr) -> None:
        if not isinstance(node, pp.BinaryExpr) or str(node.op) != "and":
            return
        matching = node.modifier.matching if node.modifier is not None else None
        if matching is None or matching.type != pp.LabelModifierType.Include:
            return
        rhs = node.rhs
        if (
            set(matching.labels) == set(POOL_SCOPE)
            and isinstance(rhs, pp.Call)
            and rhs.func.name == "label_replace"
            and scoped(rhs.args[0])
            and isinstance(rhs.args[1], pp.StringLiteral)
            and rhs.args[1].val == "pool"
        ):
            pp.walk(
                node.lhs,
                lambda n: found.append(str(n)) if isinstance(n, pp.VectorSelector) else None,
            )

    pp.walk(pp.parse(MACROS.sub("5m", expr)), visit)
    return found


def problems(dashboard: dict[str, Any], exported: dict[str, tuple[str, ...]]) -> list[str]:
    """What is wrong with the dashboard's queries; empty when nothing is."""
    found: list[str] = []
    for query in queries(dashboard):
        try:
            parsed = selectors(query.expr)
        except ValueError as exc:
            found.append(f"{query.where}: does not parse ({exc}): {query.expr}")
            continue
        whole = whole_pool(query.expr)
        if not parsed:
            found.append(f"{query.where}: reads no metric: {query.expr}")
        for selector in parsed:
            name = metric_name(selector)
            if name is None:
                found.append(f"{query.where}: a selector without a metric name: {query.expr}")
                continue
            if name not in exported:
                found.append(f"{query.where}: {name} is not a metric the operator exports")
                continue
            if not query.where.startswith("panel") and not query.where.startswith("annotation"):
                continue
            equal = _equal(selector)
            scope = POOL_SCOPE
            if str(selector) in whole:  # the pool is the join's: the namespace still filters
                scope = {k: v for k, v in POOL_SCOPE.items() if k != "pool"}
            for label, value in scope.items():
                if label in exported[name] and equal.get(label) != value:
                    found.append(f'{query.where}: {name} is not filtered by {label}="{value}"')
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


@pytest.fixture(scope="module")
def exported() -> dict[str, tuple[str, ...]]:
    return exported_metrics(Metrics())


# ---------------------------------------------------------------------- the dashboard
def test_every_query_parses_and_reads_only_exported_metrics(
    dashboard: dict[str, Any], exported: dict[str, tuple[str, ...]]
) -> None:
    assert sum(1 for _ in queries(dashboard)) > 10
    assert problems(dashboard, exported) == []


def test_the_panels_the_dashboard_promises_read_their_metrics(dashboard: dict[str, Any]) -> None:
    read = {
        metric_name(s)
        for q in queries(dashboard)
        if q.where.startswith("panel")
        for s in selectors(q.expr)
    }
    promised = {
        "prescaler_observed_demand_requests_per_second",  # demand ...
        "prescaler_forecast_mean_requests_per_second",  # ... against the mean ...
        "prescaler_forecast_upper_requests_per_second",  # ... and the upper band
        "prescaler_desired_replicas",
        "prescaler_ready_replicas",
        "prescaler_standby_replicas",
        "prescaler_cold_start_seconds",
        "prescaler_driving_constraint",
        "prescaler_scale_events_total",
        "prescaler_forecast_error_ratio",
        "prescaler_forecast_stale",
        "prescaler_forecast_age_seconds",
        "prescaler_reconcile_errors_total",
        "prescaler_forecast_fit_timeouts_total",  # beside the fit queue
        "prescaler_against_hpa_gpu_hours",  # the row "Against an HPA"
        "prescaler_against_hpa_saved_gpu_hours",
        "prescaler_against_hpa_unserved_ratio",
        "prescaler_against_hpa_short_minutes",
        "prescaler_shadow_hpa_replicas",
        "prescaler_keda_trigger_missing",  # the row "KEDA"
        "prescaler_keda_nudges_total",
    }
    assert promised <= read
    annotations = [q for q in queries(dashboard) if q.where.startswith("annotation")]
    assert any(
        metric_name(s) == "prescaler_scale_events_total"
        for q in annotations
        for s in selectors(q.expr)
    )


def test_fit_timeouts_sit_beside_the_fit_queue_per_series_and_step(
    dashboard: dict[str, Any],
) -> None:
    by_title = {p["title"]: p for p in panels(dashboard)}
    queue, timeouts = by_title["Fit queue"], by_title["Fit timeouts"]
    assert timeouts["gridPos"]["y"] == queue["gridPos"]["y"]
    assert timeouts["gridPos"]["x"] == queue["gridPos"]["x"] + queue["gridPos"]["w"]
    (target,) = timeouts["targets"]
    (selector,) = selectors(target["expr"])
    assert metric_name(selector) == "prescaler_forecast_fit_timeouts_total"
    grouped = pp.parse(MACROS.sub("5m", target["expr"]))
    assert isinstance(grouped, pp.AggregateExpr)
    assert grouped.modifier is not None
    assert set(grouped.modifier.labels) == {"series", "model"}


def test_the_whole_pool_line_reads_the_pool_of_the_selected_role(
    dashboard: dict[str, Any],
) -> None:
    """A disaggregated pool's metrics carry ``pool="<pool>/<role>"`` for each role and its
    comparison with a shadow HPA, summed, ``pool="<pool>"``; the ``pool`` variable lists
    the roles. The line *Whole pool* finds the pool of the selected role."""
    whole = [p for p in panels(dashboard) if p["title"].startswith("Whole pool: ")]
    read = set()
    for panel in whole:
        (target,) = panel["targets"]
        (selector,) = [s for s in selectors(target["expr"]) if str(s) in whole_pool(target["expr"])]
        read.add(metric_name(selector))
        join = pp.parse(MACROS.sub("5m", target["expr"]))
        assert isinstance(join, pp.BinaryExpr)
        assert isinstance(join.rhs, pp.Call)
        dst, replacement, src, regex = (a.val for a in join.rhs.args[1:])
        assert (dst, src) == ("pool", "pool")

        def relabel(value: str, regex: str = regex, replacement: str = replacement) -> str:
            """``label_replace`` on one value: the regex anchored, ``$1`` its group."""
            match = re.fullmatch(regex, value)
            template = re.sub(r"\$(\d+)", r"\\g<\1>", replacement)
            return value if match is None else match.expand(template)

        for role in ROLES:
            assert relabel(fleet_label("pd", role)) == "pd"
        assert relabel(fleet_label("pd", None)) == "pd"  # a unified pool reads its own
    assert read == {
        "prescaler_against_hpa_saved_gpu_hours",
        "prescaler_against_hpa_unserved_ratio",
        "prescaler_against_hpa_short_minutes",
        "prescaler_against_hpa_observed_hours",
    }


def test_grafana_can_load_it(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"]
    assert dashboard["title"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    occupied: set[tuple[int, int]] = set()
    for panel in panels(dashboard):
        pos = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= pos.keys(), panel["title"]
        assert min(pos["w"], pos["h"]) > 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & occupied, f"panel {panel['title']!r} overlaps another"
        occupied |= cells


def test_every_panel_has_a_title_and_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        assert panel.get("title"), panel["id"]
        if panel["type"] == "row":
            continue
        assert panel.get("datasource") == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource") == DATASOURCE, panel["title"]
    for annotation in dashboard["annotations"]["list"]:
        if annotation.get("expr"):
            assert annotation["datasource"] == DATASOURCE


def test_variables_pick_the_datasource_then_namespace_then_pool(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "pool"]  # each depends on the last
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    pool = variables["pool"]
    assert pool["datasource"] == DATASOURCE
    match = LABEL_VALUES.match(pool["query"]["query"])
    assert match is not None
    assert match.group("label") == "pool"
    assert not pool["multi"], "queries filter on one pool"
    assert not pool["includeAll"], "queries filter on one pool"


# ---------------------------------------------------------------------- the checker itself
def test_the_checker_catches_an_unknown_metric_and_a_missing_pool_filter(
    dashboard: dict[str, Any], exported: dict[str, tuple[str, ...]]
) -> None:
    broken = copy.deepcopy(dashboard)
    target = next(p for p in panels(broken) if p.get("targets"))["targets"][0]
    target["expr"] = 'sum(rate(prescaler_gone_total{pool="$pool"}[$__rate_interval]))'
    broken["panels"].append(
        {**copy.deepcopy(next(p for p in panels(dashboard) if p.get("targets"))), "id": 999}
    )
    relabel = 'label_replace({}, "pool", "$1", "pool", "(.+)/(?:prefill|decode)")'
    role = 'prescaler_desired_replicas{namespace="$namespace",pool="$pool"}'
    broken["panels"][-1]["targets"] = [
        {"expr": 'prescaler_desired_replicas{namespace="$namespace"}', "refId": "Z"},
        {"expr": "sum(rate(prescaler_reconcile_errors_total[5m])", "refId": "Y"},
        # Joins that do not tie the pool to the selected one.
        {"expr": f"prescaler_standby_replicas and on (namespace) {relabel.format(role)}"},
        {
            "expr": "prescaler_shortfall_requests_per_second and on (namespace, pool) "
            + relabel.format('prescaler_desired_replicas{namespace="$namespace"}')
        },
        {"expr": f"prescaler_forecast_age_seconds and on (namespace, pool) {role}"},
    ]
    found = problems(broken, exported)
    assert any("prescaler_gone_total is not a metric" in p for p in found)
    assert any('prescaler_desired_replicas is not filtered by pool="$pool"' in p for p in found)
    assert any("does not parse" in p for p in found)
    for name in (
        "prescaler_standby_replicas",
        "prescaler_shortfall_requests_per_second",
        "prescaler_forecast_age_seconds",
    ):
        assert any(f'{name} is not filtered by pool="$pool"' in p for p in found), name
    # The whole pool's join is scoped, but still by namespace.
    whole = f'x{{namespace="$namespace"}} and on (namespace, pool) {relabel.format(role)}'
    assert not problems({"panels": [_panel(whole)]}, {**exported, "x": ("namespace", "pool")})
    unscoped = f"prescaler_standby_replicas and on (namespace, pool) {relabel.format(role)}"
    assert problems({"panels": [_panel(unscoped)]}, exported) == [
        "panel 'x' A: prescaler_standby_replicas is not filtered by namespace=\"$namespace\""
    ]


def _panel(expr: str) -> dict[str, Any]:
    return {"title": "x", "targets": [{"expr": expr, "refId": "A"}]}


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            "histogram_quantile(0.95, sum by (le) "
            "(rate(prescaler_reconcile_duration_seconds_bucket[$__rate_interval])))",
            ["prescaler_reconcile_duration_seconds_bucket"],
        ),
        ('time() - a{pool="$pool"}', ["a"]),
        ("max_over_time(rate(b_total[5m] offset 1h)[1h:1m])", ["b_total"]),
        ('{__name__="c", pool="${pool}"} / on (pool) group_left () d', ["c", "d"]),
        ('label_replace(e, "x", "$1", "y", "(.*)")', ["e"]),
        ("count without (pod) (f == 1) > bool 0", ["f"]),
        ("vector(1)", []),
    ],
)
def test_selectors_are_found_wherever_promql_puts_them(expr: str, names: list[str]) -> None:
    assert [metric_name(s) for s in selectors(expr)] == names


def test_a_variable_outside_a_string_does_not_parse() -> None:
    with pytest.raises(ValueError, match="unexpected"):
        selectors("rate(x[$window])")


def test_queries_are_sent_with_variables_substituted_and_capture_groups_as_written() -> None:
    expr = 'label_replace(a{pool="$pool"}[$__rate_interval], "pool", "$1", "pool", "(.+)/x")'
    sent = substitute(expr, {"pool": "pd/x"}, {"rate_interval": "1m"})
    assert sent == 'label_replace(a{pool="pd/x"}[1m], "pool", "$1", "pool", "(.+)/x")'
    with pytest.raises(KeyError, match="no value for"):
        substitute('a{pool="${pol}"}', {"pool": "pd"}, {})


def test_variable_functions_are_unwrapped() -> None:
    dash = {
        "templating": {
            "list": [
                {"name": "a", "type": "query", "query": 'label_values(x{y="$z"}, pool)'},
                {"name": "b", "type": "query", "query": {"query": "label_values(pool)"}},
                {"name": "c", "type": "query", "query": "query_result(topk(3, w))"},
                {"name": "d", "type": "custom", "query": "1,2,3"},
            ]
        }
    }
    assert [q.expr for q in queries(dash)] == ['x{y="$z"}', "topk(3, w)"]
