"""One runtime for lowtide's internal topics (issue 47): ``__consumer_offsets``,
``__transaction_state`` and ``__diskless_metadata``.

Each of them is a log that a server keeps its own state in: it creates the topic on first need,
routes to the partition's leader, appends with acks=all (some conditionally on the log end), and
folds the log up to the high watermark, then keeps tailing it. This package does those steps once;
each user keeps only its record codec and its fold:

- ``topic``: the topic's spec, creating it if missing (``InternalTopic``, ``ensure_topic``) and
  the leader routing interface (``LeaderRouter``).
- ``append``: the acks=all append (conditional or not) with one retry/back-off policy
  (``RetryPolicy``, ``AppendPolicy``, ``Appender``), written as steps (``lowtide.rpc.steps``) so
  that the coordinator drives it on its event loop and the front door on a thread; the transport is
  a parameter (gRPC ``grpc_produce``, or the coordinator's framed listener).
- ``read``: folding partitions up to their leaders' high watermarks (``FoldReader``), once each
  leader's HW is settled (``grpc_settled``), and calling a leader with the same back-off
  (``call_leader``).

Why a package of its own, and where: its users live in ``lowtide.frontdoor`` (offsets,
transaction states), ``lowtide.coordinator`` (metadata log) and ``lowtide.groups`` (the offsets
fold the replicas read too). ``groups`` may import only ``record`` and the base modules, and
neither ``frontdoor`` nor ``coordinator`` may import the other, so the runtime sits below all
three and imports only what every one of them may: the base modules, ``record``, ``metadata``
(the store: topics, partition states), ``rpc`` (steps) and ``client`` (the replica client). How a
user creates the topic (the front door's topic admin, the coordinator's own assignment) and routes
to the leader (the front door's router, the coordinator's cached leader and replication listener)
are passed in: they live in packages this one may not import.
"""

from lowtide.internal_topics.append import Appender, AppendPolicy, ProduceSteps, RetryPolicy, grpc_produce
from lowtide.internal_topics.read import (
           Fetched,
           FoldReader,
           PartitionFold,
           Settler,
           call_leader,
           grpc_fetch,
           grpc_settled,
)
from lowtide.internal_topics.topic import InternalTopic, InternalTopicSpec, LeaderRouter, ensure_topic

__all__ = ["AppendPolicy", "Appender", "Fetched", "FoldReader", "InternalTopic", "InternalTopicSpec", "LeaderRouter",
           "PartitionFold", "ProduceSteps", "RetryPolicy", "Settler", "call_leader", "ensure_topic", "grpc_fetch",
           "grpc_produce", "grpc_settled"]
