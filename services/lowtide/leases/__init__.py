"""Leader leases: who acts as the front door's controller and as each diskless coordinator shard.

Two backends behind one interface (``Lease``):

    etcd        a record under an etcd lease in the cluster metadata store (put if absent, kept
                alive by its holder: lowtide.metadata.store, lowtide.coordinator.leadership); the
                default, and the only one outside Kubernetes. ``redis``, its name in releases
                before etcd (when these were Redis keys with a TTL), is still accepted for it
    kubernetes  a ``coordination.k8s.io/v1`` Lease object per role (lowtide.leases.kubernetes),
                for clusters that already run on Kubernetes' own leader election primitive

Chosen by ``--lease-backend etcd|kubernetes`` (env ``LOWTIDE_LEASE_BACKEND``) on the front door
and the coordinator; ``add_lease_flags`` declares the flags and ``kubernetes_lease`` makes a
Kubernetes one from them.
"""

from __future__ import annotations

import argparse
import os
from typing import Protocol

BACKENDS = ("etcd", "kubernetes")
# Old names still accepted (a chart values file or a flag from an older release) -> the backend.
BACKEND_ALIASES = {"redis": "etcd"}
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class Lease(Protocol):
    """A renewable leader lease held by one ``owner``.

    ``acquire_or_renew`` takes the lease when it is free or expired, renews it when this owner
    holds it, and returns whether this owner holds it now; ``valid`` says whether the owner may
    still act (renewed less than lease - margin ago); ``release`` gives it up at once if held.
    Implementations: one thread calls acquire_or_renew/release; any thread may call ``valid``.
    """

    owner: str

    def acquire_or_renew(self) -> bool: ...

    def valid(self) -> bool: ...

    def release(self) -> None: ...


def add_lease_flags(parser: argparse.ArgumentParser) -> None:
    from lowtide.common.server import add_flag

    add_flag(parser, "--lease-backend", default="etcd",
             help="where leader leases live: etcd (the default: records under etcd leases in the cluster metadata "
                  "store; 'redis', its name before etcd, is accepted for it) or kubernetes (coordination.k8s.io "
                  "Leases)")
    add_flag(parser, "--lease-namespace", default=None,
             help="namespace of the Kubernetes Leases (default: the pod's own, else 'default')")
    add_flag(parser, "--lease-name-prefix", default="lowtide",
             help="Kubernetes Lease names: <prefix>-controller, <prefix>-coordinator-<shard>")
    add_flag(parser, "--kubeconfig", default=os.environ.get("KUBECONFIG"),
             help="kubeconfig for the kubernetes lease backend outside a pod (in a pod: its service account)")


def check_backend(name: str, backend: str) -> str:
    """The backend ``backend`` names (an old name mapped to its backend); exits on an unknown one."""
    backend = BACKEND_ALIASES.get(backend, backend)
    if backend not in BACKENDS:
        raise SystemExit(f"{name}: --lease-backend must be etcd or kubernetes, got {backend!r}")
    return backend


def default_namespace() -> str:
    try:
        with open(NAMESPACE_FILE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def kubernetes_lease(args: argparse.Namespace, *, role: str, owner: str, lease_ms: int, margin_ms: int) -> Lease:
    """The Kubernetes Lease ``<--lease-name-prefix>-<role>`` in ``--lease-namespace`` (default: the
    pod's own), through ``--kubeconfig`` or the pod's service account. Imported here, not at the
    top: only a server configured with ``--lease-backend kubernetes`` needs the kubernetes package."""
    from lowtide.leases.kubernetes import KubernetesLease, load_api

    return KubernetesLease(api=load_api(kubeconfig=args.kubeconfig),
                           namespace=args.lease_namespace or default_namespace(),
                           name=f"{args.lease_name_prefix}-{role}", owner=owner, lease_ms=lease_ms,
                           margin_ms=margin_ms)
