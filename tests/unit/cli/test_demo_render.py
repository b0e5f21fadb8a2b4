"""The demo's text ending (``lowtide demo``), rendered from the document its JSON output prints: it
never offers a metrics URL of a cluster it has stopped, and says what became of its directory.
(tests/integration/cli/test_demo_and_retention.py runs the demo itself.)"""

from __future__ import annotations

from lowtide.cli.demo_cmd import _render

MIB = 1024 * 1024


def queue_doc(*, drained: bool) -> dict:
    return {"topic": "queue", "group": "workers", "records": 50, "workers": [30, 20], "delivered": 50,
            "delivered_more_than_once": 0, "errors": [], "drained": drained,
            "drained_ms_after_last_ack": 140.5 if drained else None,
            "partitions": [{"partition": 0, "before": {"lso": 0, "hw": 50, "lw": 0},
                            "after": {"lso": 50 if drained else 0, "hw": 50, "lw": 50 if drained else 0},
                            "bytes_before": {"replica-0": 2 * MIB}, "bytes_after": {"replica-0": 0}}]}


def demo_doc(*, metrics_live: bool, data_dir: str | None, drained: bool = True) -> dict:
    row = {"partition": 0, "committed_fast": 100, "committed_slow": 40, "before": {"lso": 0, "hw": 100, "lw": 0},
           "after": {"lso": 40, "hw": 100, "lw": 40}, "bytes_before": {"replica-0": 2 * MIB},
           "bytes_after": {"replica-0": MIB}, "error": None}
    return {"topic": "events", "records": 100, "produce_seconds": 1.5, "delete_records_ms": 7, "partitions": [row],
            "deleted_as_expected": True, "disk_freed_on_every_replica": True, "metrics_live": metrics_live,
            "metrics": ["http://127.0.0.1:9100/metrics"], "prometheus": "http://127.0.0.1:9090",
            "data_dir": data_dir, "queue": queue_doc(drained=drained)}


def test_after_a_stopped_run_the_metrics_are_named_as_past_and_the_temporary_directory_as_removed():
    text = _render(demo_doc(metrics_live=False, data_dir=None))
    assert "were served during the run" in text and "the cluster is stopped now" in text
    assert "live until" not in text and "Prometheus was at http://127.0.0.1:9090" in text
    assert "The demo's temporary directory was removed." in text


def test_a_kept_cluster_is_offered_live_with_the_command_that_stops_it():
    text = _render(demo_doc(metrics_live=True, data_dir="/srv/demo"))
    assert "live until `lowtide cluster down --data-dir /srv/demo`" in text
    assert "were served during the run" not in text
    assert "kept in /srv/demo" in text and "temporary directory" not in text


def test_the_queue_step_says_what_each_worker_took_and_when_the_disk_drained():
    text = _render(demo_doc(metrics_live=False, data_dir=None))
    assert "workers took 30 + 20, 0 delivered more than once" in text
    assert "  partition 0: LSO 0 -> 50 (HW 50) | disk MiB 0:   2.0 ->   0.0" in text
    assert "log starts at its end 140.5 ms after the workers' last acknowledgement" in text


def test_a_queue_that_did_not_drain_is_said_so():
    text = _render(demo_doc(metrics_live=False, data_dir=None, drained=False))
    assert "NOT AS EXPECTED: the queue's log start offsets did not reach the ends." in text
