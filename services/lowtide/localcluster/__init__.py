"""The local-cluster supervisor: ``lowtide cluster up/down/status`` and the test fixtures' cluster.

Starts real processes (redis-server, replicas, frontdoor(s), coordinator shards, the orphan scanner)
and records them in ``DIR/cluster.json`` (docs/operations.md#clusterjson).
"""

from lowtide.localcluster.cluster import ClusterError, LocalCluster
from lowtide.localcluster.config import ClusterConfig, parse_config_pairs
from lowtide.localcluster.kinds import KINDS, InstanceContext, ServiceKind
from lowtide.localcluster.state import ClusterState, ServiceEntry

__all__ = [
    "KINDS",
    "ClusterConfig",
    "ClusterError",
    "ClusterState",
    "InstanceContext",
    "LocalCluster",
    "ServiceEntry",
    "ServiceKind",
    "parse_config_pairs",
]
