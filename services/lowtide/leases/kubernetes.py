"""Leader leases on Kubernetes ``coordination.k8s.io/v1`` Lease objects.

The fields used, as client-go's leaderelection uses them:

    spec.holderIdentity        the owner acting now ("" or absent: free)
    spec.leaseDurationSeconds  how long a holder may go without renewing (whole seconds: a lease of
                               ``lease_ms`` is rounded up)
    spec.acquireTime           when the current holder took it
    spec.renewTime             when it last renewed (informational here, see below)
    spec.leaseTransitions      +1 on every change of holder
    metadata.resourceVersion   optimistic concurrency: every write is a replace at the version read,
                               so of two contenders exactly one wins and the other gets 409 Conflict

Expiry is judged by the *local* monotonic time at which this process last saw the record change
(holder or renewTime), plus the duration, never by comparing the holder's renewTime with the local
clock: clocks of different nodes may disagree, and a process that has just started waits a whole
duration before taking over from a holder it has never seen renew.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime

from kubernetes import client, config
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)


def load_api(*, kubeconfig: str | None = None) -> client.CoordinationV1Api:
    """The Lease API: in-cluster (service account) inside a pod, else ``kubeconfig``/$KUBECONFIG."""
    try:
        config.load_incluster_config()
        api_client = client.ApiClient()
    except config.ConfigException:
        api_client = config.new_client_from_config(config_file=kubeconfig)
    return client.CoordinationV1Api(api_client)


class KubernetesLease:
    """One Lease object (``namespace``/``name``) contended for by ``owner``.

    Contract: as ``lowtide.leases.Lease``. Every API call has a timeout below the renew period, so
    the lease thread never hangs past the lease; an error reads as "not held" (the caller stops
    acting once ``valid`` lapses). Thread-safety: one thread calls acquire_or_renew/release; any
    thread may call ``valid`` (a float read).
    """

    def __init__(self, *, api: client.CoordinationV1Api, namespace: str, name: str, owner: str,
                 lease_ms: int, margin_ms: int) -> None:
        if margin_ms >= lease_ms:
            raise ValueError(f"lease margin {margin_ms} ms must be below the lease {lease_ms} ms")
        self.api, self.namespace, self.name, self.owner = api, namespace, name, owner
        self.duration_s = max(1, math.ceil(lease_ms / 1000))
        self.margin_ms = margin_ms
        self.timeout_s = max(0.5, self.duration_s / 3)
        self._valid_until = 0.0
        self._seen: tuple[str, str] | None = None  # (holder, renewTime) last observed
        self._seen_at = 0.0
        self.transitions = 0  # leaseTransitions after this owner's last successful write

    # -- Lease ------------------------------------------------------------------------------------
    def acquire_or_renew(self) -> bool:
        started = time.monotonic()
        try:
            held = self._try()
        except (ApiException, OSError) as exc:  # API down, timeout: not held; retried next round
            log.warning("lease call failed", extra={"fields": {"lease": self.name, "error": str(exc)[:200]}})
            held = False
        # Measured from before the call: the lease may have started as early as that.
        self._valid_until = started + (self.duration_s * 1000 - self.margin_ms) / 1000 if held else 0.0
        return held

    def valid(self) -> bool:
        return time.monotonic() < self._valid_until

    def release(self) -> None:
        if self._valid_until == 0.0:
            return
        self._valid_until = 0.0
        try:
            lease = self._read()
            if lease is not None and lease.spec.holder_identity == self.owner:
                lease.spec.holder_identity = None
                self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=self.timeout_s)
        except (ApiException, OSError):  # the lease then expires on its own
            log.debug("could not release the lease", exc_info=True)

    def holder(self) -> str:
        lease = self._read()
        return (lease.spec.holder_identity or "") if lease is not None else ""

    # -- one round --------------------------------------------------------------------------------
    def _read(self) -> client.V1Lease | None:
        try:
            return self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.timeout_s)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _try(self) -> bool:
        now = datetime.now(UTC)
        lease = self._read()
        if lease is None:
            body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                                  spec=client.V1LeaseSpec(holder_identity=self.owner, acquire_time=now,
                                                          renew_time=now, lease_duration_seconds=self.duration_s,
                                                          lease_transitions=0))
            return self._write(lambda: self.api.create_namespaced_lease(
                self.namespace, body, _request_timeout=self.timeout_s), transitions=0)
        spec = lease.spec
        holder = spec.holder_identity or ""
        record = (holder, str(spec.renew_time))
        if record != self._seen:
            self._seen, self._seen_at = record, time.monotonic()
        if holder == self.owner:
            spec.renew_time = now
            spec.lease_duration_seconds = self.duration_s
        else:
            duration = spec.lease_duration_seconds or self.duration_s
            if holder and time.monotonic() < self._seen_at + duration:
                return False  # someone else holds it and renewed within its duration
            spec.holder_identity, spec.acquire_time, spec.renew_time = self.owner, now, now
            spec.lease_duration_seconds = self.duration_s
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            log.info("taking over a lease", extra={"fields": {"lease": self.name, "from": holder or None,
                                                              "transitions": spec.lease_transitions}})
        return self._write(lambda: self.api.replace_namespaced_lease(
            self.name, self.namespace, lease, _request_timeout=self.timeout_s), transitions=spec.lease_transitions)

    def _write(self, call, *, transitions: int) -> bool:
        try:
            call()
        except ApiException as exc:
            if exc.status == 409:  # another writer got there first (resourceVersion moved on)
                return False
            raise
        self.transitions = transitions
        return True
