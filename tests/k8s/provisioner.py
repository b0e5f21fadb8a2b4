"""hostPath PersistentVolume provisioner of the local Kubernetes harness (tests/k8s/up.sh).

Serves the StorageClass ``lowtide-hostpath`` (provisioner ``lowtide.local/hostpath``): every
pending PersistentVolumeClaim of that class gets a PersistentVolume pre-bound to it, backed by a
directory ``<root>/<namespace>-<claim>-<uid>`` on the node (there is one node); a Released volume
of ours is deleted with its directory (reclaimPolicy Delete), as kind's local-path provisioner
does. Directories are world-writable because hostPath volumes ignore a pod's ``fsGroup`` and the
lowtide pods run as uid 10001.

Polls once a second (simple and self-healing: a missed event is picked up on the next pass).

    python tests/k8s/provisioner.py --root DIR [--kubeconfig PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time

from kubernetes import client, config
from kubernetes.client.rest import ApiException

PROVISIONER = "lowtide.local/hostpath"
STORAGE_CLASS = "lowtide-hostpath"


def provision_pending(core: client.CoreV1Api, root: str) -> None:
    for pvc in core.list_persistent_volume_claim_for_all_namespaces(_request_timeout=10).items:
        if pvc.status.phase != "Pending" or pvc.spec.volume_name:
            continue
        if (pvc.spec.storage_class_name or "") != STORAGE_CLASS:
            continue
        meta = pvc.metadata
        path = os.path.join(root, f"{meta.namespace}-{meta.name}-{meta.uid[:8]}")
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o1777)
        size = pvc.spec.resources.requests.get("storage", "1Gi")
        pv = client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=f"pvc-{meta.uid}",
                                         annotations={"pv.kubernetes.io/provisioned-by": PROVISIONER}),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": size},
                access_modes=pvc.spec.access_modes or ["ReadWriteOnce"],
                persistent_volume_reclaim_policy="Delete",
                storage_class_name=STORAGE_CLASS,
                host_path=client.V1HostPathVolumeSource(path=path, type="Directory"),
                claim_ref=client.V1ObjectReference(kind="PersistentVolumeClaim", namespace=meta.namespace,
                                                   name=meta.name, uid=meta.uid),
            ),
        )
        try:
            core.create_persistent_volume(pv, _request_timeout=10)
            print(f"provisioned {pv.metadata.name} for {meta.namespace}/{meta.name} at {path}", flush=True)
        except ApiException as e:
            if e.status != 409:  # 409: made on an earlier pass
                raise


def delete_released(core: client.CoreV1Api, root: str) -> None:
    for pv in core.list_persistent_volume(_request_timeout=10).items:
        ours = (pv.metadata.annotations or {}).get("pv.kubernetes.io/provisioned-by") == PROVISIONER
        if not ours or pv.status.phase != "Released" or pv.spec.persistent_volume_reclaim_policy != "Delete":
            continue
        path = pv.spec.host_path.path if pv.spec.host_path else ""
        if path.startswith(root + os.sep):
            shutil.rmtree(path, ignore_errors=True)
        try:
            core.delete_persistent_volume(pv.metadata.name, _request_timeout=10)
            print(f"deleted {pv.metadata.name} and {path}", flush=True)
        except ApiException as e:
            if e.status != 404:
                raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="directory the volumes are made in")
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    os.makedirs(root, exist_ok=True)
    config.load_kube_config(config_file=args.kubeconfig)
    core = client.CoreV1Api()
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    while not stop:
        try:
            provision_pending(core, root)
            delete_released(core, root)
        except Exception as e:  # noqa: BLE001 - keep serving: the next pass retries
            print(f"provisioner: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
