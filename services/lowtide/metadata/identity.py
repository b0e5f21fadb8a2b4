"""Fail-stop, never delete, when the metadata store does not know us.

Every service that keeps data records the cluster it belongs to in its data directory, as Kafka's
``meta.properties`` (cluster id and node id), and the store revision it last saw. At start-up and
while it runs, it compares them with the store:

* the store has no cluster id (emptied, or a fresh one put in its place),
* the store's cluster id is another one,
* the store's revision is older than the one recorded (rolled back to an older snapshot),

and in each case it stops with one clear log line naming both ids, touching nothing: no partition is
opened, set aside or deleted on the word of a store that forgot the cluster
(docs/design/metadata.md#when-the-store-forgets). A stateless service (the front door) has no
data directory: it only checks, at run time, that the store keeps the id it started with.

``meta.properties`` (Java properties text, written ``.tmp`` + fsync + rename)::

    version=1
    cluster.id=38a84aae31944651ba846ba148288e7c
    node.id=replica-0
    metadata.revision=1234

Thread-safety: ``ClusterGuard`` runs one thread; ``check_cluster_identity`` runs once at start-up.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from lowtide.errors import MetadataStoreUnavailable
from lowtide.metadata.store import MetadataStore

log = logging.getLogger(__name__)

META_PROPERTIES = "meta.properties"
VERSION = "1"
# The exit code of a fail-stop (EX_CONFIG): a supervisor shows the service failing, not finished.
FAIL_STOP_EXIT = 78


@dataclass(frozen=True)
class MetaProperties:
    cluster_id: str
    node_id: str
    revision: int


def read_meta_properties(data_dir: Path) -> MetaProperties | None:
    path = data_dir / META_PROPERTIES
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    if fields.get("version") != VERSION or not fields.get("cluster.id"):
        raise SystemExit(f"{path}: unreadable (version {fields.get('version')!r}, expected {VERSION}, "
                         "and a cluster.id): fix or restore it; nothing was touched")
    return MetaProperties(cluster_id=fields["cluster.id"], node_id=fields.get("node.id", ""),
                          revision=int(fields.get("metadata.revision") or 0))


def write_meta_properties(data_dir: Path, props: MetaProperties) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)  # a first start, or a disk lost and replaced
    path = data_dir / META_PROPERTIES
    tmp = data_dir / (META_PROPERTIES + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(f"version={VERSION}\ncluster.id={props.cluster_id}\nnode.id={props.node_id}\n"
                 f"metadata.revision={props.revision}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class ClusterIdentityMismatch(SystemExit):
    """Raised at start-up when the store does not know the cluster of the data directory."""


def check_cluster_identity(store: MetadataStore, *, data_dir: Path | None, node_id: str,
                           timeout_s: float = 60.0) -> str:
    """Compare the data directory's cluster with the store's (module doc); returns the cluster id.

    A data directory without ``meta.properties`` is a first start: it adopts the store's cluster id,
    creating one in an empty store. Raises ``ClusterIdentityMismatch`` (a SystemExit) naming both
    ids otherwise, and ``MetadataStoreUnavailable`` when the store does not answer in ``timeout_s``.
    """
    store.start(timeout_s=timeout_s)
    store.sync()
    props = read_meta_properties(data_dir) if data_dir is not None else None
    stored = store.stored_cluster_id()
    if props is not None:
        problem = _compare(props, stored, store.version())
        if problem:
            line = (f"{node_id}: stopping, touching nothing: {problem} (data directory {data_dir} belongs to "
                    f"cluster {props.cluster_id}; metadata store {store.url}). Restore the store "
                    "(etcdctl snapshot restore) or point --metadata-url at the right one.")
            log.critical(line)
            raise ClusterIdentityMismatch(line)
        cluster_id = props.cluster_id
    else:
        cluster_id = store.cluster_id()  # creates one in an empty store
    store.adopt_cluster_id(cluster_id)
    if data_dir is not None:
        write_meta_properties(data_dir, MetaProperties(cluster_id=cluster_id, node_id=node_id,
                                                       revision=max(store.version(), props.revision if props else 0)))
    return cluster_id


def _compare(props: MetaProperties, stored: str | None, revision: int) -> str:
    if stored is None:
        return "the metadata store is empty (it has no cluster id)"
    if stored != props.cluster_id:
        return f"the metadata store belongs to another cluster ({stored})"
    if revision < props.revision:
        return (f"the metadata store is older than this service last saw (revision {revision} < "
                f"{props.revision}: rolled back)")
    return ""


class ClusterGuard:
    """While the service runs: every ``interval_s`` asks the store for its cluster id and revision,
    fail-stops on the conditions of the module doc, and records the revision seen in
    ``meta.properties`` (so a restart recognises a store rolled back meanwhile). The image itself
    refuses a change that removes or replaces the cluster id (image.py), so nothing acts on it
    before this thread stops the process."""

    def __init__(self, store: MetadataStore, *, cluster_id: str, data_dir: Path | None, node_id: str,
                 interval_s: float = 2.0) -> None:
        self._store = store
        self._cluster_id = cluster_id
        self._data_dir = data_dir
        self._node_id = node_id
        self._interval_s = interval_s
        self._recorded = 0
        self._stop = threading.Event()
        store.image.guard(store.cluster_id_key, cluster_id.encode(), on_lost=self.fail_stop)

    def start(self) -> None:
        threading.Thread(target=self._run, name="cluster-guard", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def fail_stop(self, problem: str) -> None:
        log.critical(f"{self._node_id}: stopping, touching nothing: {problem} (this service belongs to cluster "
                     f"{self._cluster_id}; metadata store {self._store.url}). Restore the store "
                     "(etcdctl snapshot restore) or point --metadata-url at the right one.")
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(FAIL_STOP_EXIT)

    def check(self) -> None:
        """One look at the store (raises MetadataStoreUnavailable when it does not answer)."""
        client = self._store.client
        kv = client.get(self._store.cluster_id_key, timeout_s=2.0)
        seen = self._store.version()
        problem = _compare(MetaProperties(self._cluster_id, self._node_id, seen),
                           kv.value.decode() if kv is not None else None, client.revision(timeout_s=2.0))
        if problem:
            self.fail_stop(problem)
        if self._data_dir is not None and seen > self._recorded:
            write_meta_properties(self._data_dir, MetaProperties(self._cluster_id, self._node_id, seen))
            self._recorded = seen

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.check()
            except MetadataStoreUnavailable:
                continue  # away is not forgotten: keep serving from what we know
            except OSError as exc:
                log.warning("recording the metadata revision in %s failed: %s", self._data_dir, exc)
