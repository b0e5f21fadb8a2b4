"""Grafana dashboards as code: Deletion, Diskless and Cluster.

The panels are declared as data (``Panel``: a title, PromQL targets, a unit) and built with
Grafana's own Foundation SDK (``grafana-foundation-sdk``), whose builders are generated from
Grafana's dashboard schema, so the JSON has the shape Grafana imports. ``write_dashboards``
writes ``charts/lowtide/dashboards/<uid>.json`` (``make dashboards``); a unit test checks the
committed files are what this module generates, and the observability test evaluates every
target's expression against a real Prometheus.

Template variables: ``namespace`` (Kubernetes' namespace label; absent locally, where ``All``
(``.*``) still matches), ``topic`` and ``partition``. Every selector on a per-partition series
carries ``$SEL`` below; rates use ``$__rate_interval``.

The SDK is a development dependency (the ``test`` extra): only generating the files needs it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NS = 'namespace=~"$namespace"'
SEL = f'{NS},topic=~"$topic",partition=~"$partition"'
TOPIC_SEL = f'{NS},topic=~"$topic"'
RATE = "$__rate_interval"
DATASOURCE_UID = "${datasource}"


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    targets: Sequence[Target]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat
    description: str = ""
    width: int = 12


@dataclass(frozen=True)
class Row:
    title: str
    panels: Sequence[Panel] = field(default_factory=tuple)


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    rows: Sequence[Row]

    def panels(self) -> Iterator[Panel]:
        for row in self.rows:
            yield from row.panels


def _quantiles(metric: str, selector: str, by: str = "") -> list[Target]:
    group = f"le{', ' + by if by else ''}"
    legend = f"{{{{{by}}}}} " if by else ""
    return [Target(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
                   f"{legend}p{int(q * 100)}") for q in (0.5, 0.99)]


# KIP-714 metric names (Kafka's: group without "-metrics", then the metric, dots for dashes).
PRODUCE_LATENCY = "org.apache.kafka.producer.request.latency"
FETCH_LATENCY = "org.apache.kafka.consumer.fetch.manager.fetch.latency"


def _client_latency(metric: str) -> list[Target]:
    """A client latency's avg and max per client id (lowtide_client_metric's name label)."""
    return [Target(f'max by (client_id) (lowtide_client_metric{{{NS},name="{metric}.{stat}"}})',
                   f"{{{{client_id}}}} {stat}") for stat in ("avg", "max")]


DELETION = DashboardSpec(
    uid="lowtide-deletion",
    title="lowtide / Deletion",
    description="KIP-107 DeleteRecords, KIP-68 consumed retention and reclaimed disk space, per topic and partition",
    rows=[
        Row("Offsets", [
            Panel("Log start offset, high watermark, low watermark", [
                Target(f"max by (topic, partition) (lowtide_partition_log_start_offset{{{SEL}}})",
                       "LSO {{topic}}-{{partition}}"),
                Target(f"max by (topic, partition) (lowtide_partition_high_watermark{{{SEL}}})",
                       "HW {{topic}}-{{partition}}"),
                Target(f"max by (topic, partition) (lowtide_partition_low_watermark{{{SEL}}})",
                       "LW {{topic}}-{{partition}}"),
            ], description="LSO: the leader's log start offset (what DeleteRecords raised); LW: the minimum over "
                           "the leader and its live replicas (what every replica has deleted)"),
            Panel("Low-watermark lag (leader LSO - LW)", [
                Target(f"max by (topic, partition) (lowtide_partition_low_watermark_lag_records{{{SEL}}})",
                       "{{topic}}-{{partition}}"),
            ], description="Records deleted on the leader but not yet on every live replica; stuck above 0 means "
                           "a replica is not fetching"),
            Panel("Consumed-retention lag (min committed - LW)", [
                Target(f"max by (topic, partition) (lowtide_consumed_retention_lag_records{{{SEL}}})",
                       "{{topic}}-{{partition}}"),
            ], description="Records every consumer group has consumed that are not deleted yet (KIP-68)"),
        ]),
        # KIP-932 share groups named in consumed.retention.groups (share/metrics.py): what a queue
        # has delivered and what is still on disk. Only leaders export the lag; a former leader
        # keeps its last start/end values until the share-partition loads again, hence max.
        Row("Share groups (KIP-932)", [
            Panel("Share-group low-watermark lag (start offset - LW)", [
                Target(f"max by (group, topic, partition) (lowtide_share_group_low_watermark_lag_records{{{SEL}}})",
                       "{{group}} {{topic}}-{{partition}}"),
            ], width=8, description="Records a share group acknowledged or archived (below its share-partition "
                                    "start offset) that are not deleted on every replica yet"),
            Panel("Share-partition start and end offsets", [
                Target(f"max by (group, topic, partition) (lowtide_share_partition_start_offset{{{SEL}}})",
                       "start {{group}} {{topic}}-{{partition}}"),
                Target(f"max by (group, topic, partition) (lowtide_share_partition_end_offset{{{SEL}}})",
                       "end {{group}} {{topic}}-{{partition}}"),
            ], width=8, description="Start: every record below is acknowledged or archived; end: the next "
                                    "offset never acquired"),
            Panel("Share-partition records in flight, by state", [
                Target(f"sum by (group, state) (lowtide_share_partition_records{{{SEL}}})", "{{group}} {{state}}"),
            ], width=8, description="Available (released or lock timed out), acquired, acknowledged, archived"),
        ]),
        Row("DeleteRecords", [
            Panel("DeleteRecords results / s", [
                Target(f"sum by (result) (rate(lowtide_delete_records_total{{{NS}}}[{RATE}]))", "{{result}}"),
            ], unit="ops", width=8),
            Panel("DeleteRecords errors / s", [
                Target(f'sum by (result) (rate(lowtide_delete_records_total{{{NS},result!="NONE"}}[{RATE}]))',
                       "{{result}}"),
            ], unit="ops", width=8),
            Panel("DeleteRecords latency", _quantiles("lowtide_delete_records_duration_seconds", NS),
                  unit="s", width=8),
            Panel("Purgatory: pending delayed operations", [
                Target(f"sum by (operation) (lowtide_purgatory_pending{{{NS}}})", "{{operation}}"),
            ]),
            Panel("Purgatory: expired / s", [
                Target(f"sum by (operation) (rate(lowtide_purgatory_expired_total{{{NS}}}[{RATE}]))",
                       "{{operation}}"),
            ], unit="ops"),
        ]),
        Row("Disk", [
            Panel("Bytes on disk per replica", [
                Target(f"sum by (replica) (lowtide_partition_size_bytes{{{SEL}}})", "replica {{replica}}"),
            ], unit="bytes"),
            Panel("Bytes reclaimed / s", [
                Target(f"sum(rate(lowtide_log_reclaimed_bytes_total{{{NS}}}[{RATE}]))", "reclaimed"),
            ], unit="Bps"),
            Panel("Segments per partition", [
                Target(f"max by (topic, partition) (lowtide_partition_segments{{{SEL}}})",
                       "{{topic}}-{{partition}}"),
            ]),
            Panel("Log cleaner: tombstones removed and delete horizons set / s (KIP-534)", [
                Target(f"sum(rate(lowtide_log_cleaner_tombstones_removed_total{{{NS}}}[{RATE}]))",
                       "tombstones removed"),
                Target(f"sum(rate(lowtide_log_cleaner_delete_horizons_set_total{{{NS}}}[{RATE}]))",
                       "horizons set"),
            ], unit="ops"),
        ]),
    ],
)

DISKLESS = DashboardSpec(
    uid="lowtide-diskless",
    title="lowtide / Diskless",
    description="KIP-1164 diskless topics: coordinator shards, object storage, orphan scans",
    rows=[
        Row("Coordinator", [
            # Counted by the shard, not by gRPC: brokers send CommitFile to its framed listener.
            Panel("CommitFile / s per shard", [
                Target(f'sum by (instance) (rate(lowtide_coordinator_commit_requests_total{{{NS}}}[{RATE}]))',
                       "{{instance}}"),
            ], unit="ops", width=8),
            Panel("CommitFile latency", _quantiles("lowtide_coordinator_commit_duration_seconds", NS),
                  unit="s", width=8),
            Panel("FindBatches latency", _quantiles(
                "lowtide_grpc_server_handling_seconds",
                f'{NS},grpc_service="lowtide.v1.DisklessCoordinator",grpc_method="FindBatches"'),
                unit="s", width=8),
            Panel("Batches per shard", [
                Target(f"sum by (shard) (lowtide_coordinator_batches{{{NS}}})", "shard {{shard}}"),
            ]),
            Panel("Files per shard", [
                Target(f"sum by (shard) (lowtide_coordinator_files{{{NS}}})", "shard {{shard}}"),
            ]),
        ]),
        Row("Object storage and orphan scans", [
            Panel("Object store bytes / s", [
                Target(f"sum by (operation) (rate(lowtide_objectstore_bytes_total{{{NS}}}[{RATE}]))",
                       "{{operation}}"),
            ], unit="Bps"),
            Panel("Orphan scan duration", [
                Target(f"max(lowtide_orphan_scan_duration_seconds{{{NS}}})", "last scan"),
            ], unit="s", width=6),
            Panel("Orphan files deleted / s", [
                Target(f"sum(rate(lowtide_orphan_files_deleted_total{{{NS}}}[{RATE}]))", "deleted"),
            ], unit="ops", width=6),
        ]),
    ],
)

CLUSTER = DashboardSpec(
    uid="lowtide-cluster",
    title="lowtide / Cluster",
    description="Replicas, partitions health, ISR churn, throughput, request errors, and the latency clients "
                "measure (KIP-714 telemetry)",
    rows=[
        Row("Health", [
            Panel("Replicas alive / registered", [
                Target(f"max(lowtide_cluster_brokers_alive{{{NS}}})", "alive"),
                Target(f"max(lowtide_cluster_brokers_registered{{{NS}}})", "registered"),
            ], kind="stat", width=6),
            Panel("Under-replicated partitions", [
                Target(f"sum(max by (topic) (lowtide_cluster_under_replicated_partitions{{{TOPIC_SEL}}}))",
                       "under-replicated"),
            ], kind="stat", width=6),
            Panel("Offline partitions", [
                Target(f"sum(max by (topic) (lowtide_cluster_offline_partitions{{{TOPIC_SEL}}}))", "offline"),
            ], kind="stat", width=6),
            Panel("ISR shrinks and expands / s", [
                Target(f"sum(rate(lowtide_isr_shrinks_total{{{TOPIC_SEL}}}[{RATE}]))", "shrinks"),
                Target(f"sum(rate(lowtide_isr_expands_total{{{TOPIC_SEL}}}[{RATE}]))", "expands"),
            ], unit="ops", width=6),
        ]),
        Row("Throughput", [
            Panel("Records appended / s per topic", [
                Target(f"sum by (topic) (max by (topic, partition) "
                       f"(deriv(lowtide_partition_log_end_offset{{{SEL}}}[{RATE}])))", "{{topic}}"),
            ], unit="ops"),
            Panel("Produce and fetch bytes / s", [
                Target(f"sum by (topic) (rate(lowtide_produce_bytes_total{{{TOPIC_SEL}}}[{RATE}]))",
                       "produce {{topic}}"),
                Target(f"sum by (kind) (rate(lowtide_fetch_bytes_total{{{TOPIC_SEL}}}[{RATE}]))", "fetch {{kind}}"),
            ], unit="Bps"),
        ]),
        Row("Requests", [
            Panel("Requests / s per RPC", [
                Target(f"sum by (grpc_service, grpc_method) "
                       f"(rate(lowtide_grpc_server_handled_total{{{NS}}}[{RATE}]))", "{{grpc_method}}"),
            ], unit="reqps", width=8),
            Panel("Errors / s per RPC and code", [
                Target(f'sum by (grpc_method, grpc_code) '
                       f'(rate(lowtide_grpc_server_handled_total{{{NS},grpc_code!="OK"}}[{RATE}]))',
                       "{{grpc_method}} {{grpc_code}}"),
            ], unit="reqps", width=8),
            Panel("Unary latency p99 per RPC", [
                Target(f'histogram_quantile(0.99, sum by (le, grpc_method) '
                       f'(rate(lowtide_grpc_server_handling_seconds_bucket{{{NS},grpc_type="unary"}}[{RATE}])))',
                       "{{grpc_method}}"),
            ], unit="s", width=8),
        ]),
        # KIP-714: what the clients measure themselves and push (observability/client_telemetry.py).
        Row("Clients (KIP-714 telemetry)", [
            Panel("Produce latency seen by producers", _client_latency(PRODUCE_LATENCY), unit="ms", width=8,
                  description="Kafka's producer request-latency avg and max (ms), per client id, as the "
                              "producers measure them, from send to response, and push them (KIP-714)"),
            Panel("Fetch latency seen by consumers", _client_latency(FETCH_LATENCY), unit="ms", width=8,
                  description="Kafka's consumer fetch-latency avg and max (ms), per client id, as the "
                              "consumers measure them (long-poll waits included) and push them (KIP-714)"),
            Panel("Clients pushing telemetry", [
                Target(f"sum(lowtide_client_telemetry_clients{{{NS}}})", "client instances"),
                Target(f"sum(lowtide_client_telemetry_series{{{NS}}})", "series"),
            ], width=8, description="Client instances subscribed or pushing, and the series kept of them; "
                                    "capped by --client-telemetry-max-clients and -max-series-per-client"),
        ]),
    ],
)

DASHBOARDS: tuple[DashboardSpec, ...] = (DELETION, DISKLESS, CLUSTER)


def iter_exprs(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(panel title, expr) of every target of a dashboard's JSON (as written to the chart)."""
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets") or []:
                if target.get("expr"):
                    yield inner.get("title", ""), target["expr"]


def build_dashboard(spec: DashboardSpec) -> dict:
    """The dashboard's JSON model, built with the Foundation SDK."""
    from grafana_foundation_sdk.builders import dashboard as dash
    from grafana_foundation_sdk.builders import prometheus, stat, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

    datasource = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
    builder = (dash.Dashboard(spec.title).uid(spec.uid).description(spec.description)
               .tags(["lowtide"]).refresh("30s").time("now-1h", "now").timezone("browser")
               .with_variable(dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))

    def query_variable(name: str, query: str) -> dash.QueryVariable:
        return (dash.QueryVariable(name).label(name).datasource(datasource).query(query)
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
                .multi(True).include_all(True).all_value(".*"))

    builder = (builder
               .with_variable(query_variable("namespace", "label_values(lowtide_partition_high_watermark, namespace)"))
               .with_variable(query_variable("topic", f"label_values(lowtide_partition_high_watermark{{{NS}}}, topic)"))
               .with_variable(query_variable(
                   "partition", f"label_values(lowtide_partition_high_watermark{{{TOPIC_SEL}}}, partition)")))
    for row in spec.rows:
        builder = builder.with_row(dash.Row(row.title))
        for panel in row.panels:
            module = stat if panel.kind == "stat" else timeseries
            p = (module.Panel().title(panel.title).datasource(datasource).unit(panel.unit)
                 .span(panel.width).height(8))
            if panel.description:
                p = p.description(panel.description)
            for index, target in enumerate(panel.targets):
                p = p.with_target(prometheus.Dataquery().expr(target.expr).legend_format(target.legend or "__auto")
                                  .ref_id(chr(ord("A") + index)).datasource(datasource))
            builder = builder.with_panel(p)
    return json.loads(json.dumps(builder.build(), cls=JSONEncoder))


def render_dashboards() -> dict[str, str]:
    """File name -> JSON text of every dashboard (stable: sorted keys, trailing newline)."""
    return {f"{spec.uid}.json": json.dumps(build_dashboard(spec), indent=2, sort_keys=True) + "\n"
            for spec in DASHBOARDS}


def write_dashboards(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_dashboards().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written
