"""Honest answers through the real `lowtide` command on real clusters: the retention dry run says
what it would delete and deletes nothing, an unknown topic fails every command that names it, the
README's commands run as written. (That the demo leaves no directory, process or dead URL behind is
tests/integration/cli/test_demo_and_retention.py and tests/unit/cli/test_demo_render.py.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lowtide_pb import admin_pb2
from tests.integration import support as s

REPO_ROOT = Path(__file__).resolve().parents[3]


def commit(cluster, group: str, offsets: dict[tuple[str, int], int]) -> None:
    s.admin(cluster).OffsetCommit(admin_pb2.OffsetCommitRequest(group_id=group, partitions=[
        admin_pb2.OffsetCommitPartition(topic=t, partition=p, offset=o) for (t, p), o in offsets.items()]))


def test_retention_dry_run_shows_the_plan_per_partition_and_deletes_nothing_on_any_replica(shared_cluster):
    cluster = shared_cluster  # faults nothing; its topic and groups are its own (hc-)
    s.create_topic(cluster, "hc-inter", partitions=2, rf=3)
    for p in (0, 1):
        assert s.produce(cluster, "hc-inter", [b"x" * 100] * 200, partition=p).error_code == 0
    [trimmed] = s.delete_records(cluster, [("hc-inter", 1, 60)])
    assert trimmed.error_code == 0
    commit(cluster, "hc-fast", {("hc-inter", 0): 180, ("hc-inter", 1): 150})
    commit(cluster, "hc-slow", {("hc-inter", 0): 120, ("hc-inter", 1): 40})

    dry = s.cli_json("retention", "run", "--bootstrap-server", cluster.bootstrap, "--topic", "hc-inter", "--dry-run")
    rows = {r["partition"]: r for r in dry["partitions"]}
    assert dry["dry_run"] is True and dry["groups"] == ["hc-fast", "hc-slow"]
    assert (rows[0]["log_start_offset"], rows[0]["delete_before"], rows[0]["records"], rows[0]["min_groups"]) == (
        0, 120, 120, ["hc-slow"])
    assert rows[0]["committed"] == {"hc-fast": 180, "hc-slow": 120} and "skipped" not in rows[0]
    assert (rows[1]["log_start_offset"], rows[1]["delete_before"], rows[1]["records"]) == (60, 40, 0)
    assert "already starts at 60" in rows[1]["skipped"]
    for r in (0, 1, 2):
        assert s.describe(cluster, r, "hc-inter", 0).log_start_offset == 0   # nothing deleted anywhere

    text = s.lowtide_cli("retention", "run", "--bootstrap-server", cluster.bootstrap, "--topic", "hc-inter",
                         "--dry-run")
    assert text.returncode == 0, text.stderr
    assert "partition: hc-inter-0\tlog_start_offset: 0\ttarget: 120 (set by hc-slow)\twould delete 120 records " \
           "(offsets 0..119)" in text.stdout

    done = s.cli_json("retention", "run", "--bootstrap-server", cluster.bootstrap, "--topic", "hc-inter")
    row0 = next(r for r in done["partitions"] if r["partition"] == 0)
    assert row0["low_watermark"] == rows[0]["delete_before"]   # the run did what the dry run said


@pytest.mark.parametrize("output", ["json", "text"])
def test_an_unknown_topic_fails_every_command_that_names_it(shared_cluster, tmp_path, output):
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({"partitions": [{"topic": "nosuch", "partition": 0, "offset": 1}], "version": 1}))
    commands = [["topics", "describe", "--topic", "nosuch"], ["topics", "delete", "--topic", "nosuch"],
                ["produce", "--topic", "nosuch", "--num-records", "0"],
                ["consume", "--topic", "nosuch", "--timeout-ms", "200"],
                ["consume", "--topic", "nosuch", "--group", "g", "--timeout-ms", "200"],
                ["offsets", "--topic", "nosuch"], ["delete-records", "--offset-json-file", str(offsets)],
                ["retention", "run", "--topic", "nosuch"], ["retention", "run", "--topic", "nosuch", "--dry-run"]]
    for argv in commands:
        proc = s.lowtide_cli(*argv, "--bootstrap-server", shared_cluster.bootstrap, "--output", output)
        assert proc.returncode != 0, (argv, proc.stdout, proc.stderr)
        shown = proc.stdout if output == "json" else proc.stderr + proc.stdout
        assert "UNKNOWN_TOPIC_OR_PARTITION" in shown, (argv, proc.stdout, proc.stderr)


def readme_using_it_block() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("## Using it"):]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


# A whole pipeline of separate programs (Spark JVMs, a cluster): minutes when the parallel suite
# shares 2 cores; the suite-wide 300 s is a hang guard, this one too, with room for a busy machine.
@pytest.mark.timeout(600)
def test_the_readme_commands_run_as_written_against_a_fresh_cluster(tmp_path):
    for tool, path in (("jq", shutil.which("jq")), ("grpcurl", REPO_ROOT / ".tools/bin/grpcurl"),
                       ("redis-server", shutil.which("redis-server"))):
        if not path or not Path(path).exists():
            pytest.skip(f"{tool} is not installed (make setup installs it)")
    data_dir = tmp_path / "lt"
    script = readme_using_it_block().replace("/tmp/lt", str(data_dir))
    try:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=540)
    finally:
        s.lowtide_cli("cluster", "down", "--data-dir", str(data_dir))  # whatever line failed
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "lowtide.v1.Admin" in proc.stdout and '"low_watermark"' in proc.stdout
    assert "Dry run: nothing was deleted." in proc.stdout



def test_the_readme_tls_commands_run_as_written(tmp_path):
    if not (REPO_ROOT / ".tools/bin/grpcurl").exists() or not shutil.which("jq"):
        pytest.skip("grpcurl or jq is not installed (make setup installs them)")
    text = (REPO_ROOT / "README.md").read_text()
    [script] = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "--tls" in b]
    data_dir = tmp_path / "lts"
    try:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script.replace("/tmp/lts", str(data_dir))],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    finally:
        s.lowtide_cli("cluster", "down", "--data-dir", str(data_dir))
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "lowtide.v1.Admin" in proc.stdout  # grpcurl listed the services over mutual TLS
