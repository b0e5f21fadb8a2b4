"""The one exception root of lowtide, with Kafka's error names and codes.

Every domain error is a ``LowtideError`` subclass carrying behaviour attributes, so callers decide
what to do from the error, never from a hand-kept list of codes:

* ``code``              Kafka's numeric error code (``org.apache.kafka.common.protocol.Errors``)
* ``name``              Kafka's error name, e.g. ``OFFSET_OUT_OF_RANGE``
* ``retriable``         retrying the same request may succeed (Kafka's ``RetriableException``)
* ``invalid_metadata``  the caller's view of leaders/partitions is stale: refresh metadata, then
                        retry (Kafka's ``InvalidMetadataException``); implies ``retriable``

Per-partition results carry errors as data (``error.code`` / ``error.message`` in a response);
whole-call failures are raised. This module knows nothing of gRPC: ``lowtide.rpc.status`` holds
the one table between these errors and gRPC status codes.
"""

from __future__ import annotations


class LowtideError(Exception):
    code: int = -1
    name: str = "UNKNOWN_SERVER_ERROR"
    retriable: bool = False
    invalid_metadata: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.name)
        self.message = message or self.name


class RetriableError(LowtideError):
    retriable = True


class InvalidMetadataError(RetriableError):
    """The leader or partition the caller addressed is not what it thought: refresh, retry."""

    invalid_metadata = True


class UnknownServerError(LowtideError):
    pass


class OffsetOutOfRange(LowtideError):
    code, name = 1, "OFFSET_OUT_OF_RANGE"


class CorruptMessage(LowtideError):
    # Kafka retries a corrupt record (network corruption). Here gRPC checks its frames, so a bad
    # batch is the sender's bug: resending the same bytes cannot succeed.
    code, name = 2, "CORRUPT_MESSAGE"


class UnknownTopicOrPartition(InvalidMetadataError):
    code, name = 3, "UNKNOWN_TOPIC_OR_PARTITION"


class InvalidFetchSize(LowtideError):
    code, name = 4, "INVALID_FETCH_SIZE"


class LeaderNotAvailable(InvalidMetadataError):
    code, name = 5, "LEADER_NOT_AVAILABLE"


class NotLeaderOrFollower(InvalidMetadataError):
    code, name = 6, "NOT_LEADER_OR_FOLLOWER"


class RequestTimedOut(RetriableError):
    code, name = 7, "REQUEST_TIMED_OUT"


class MetadataStoreUnavailable(RequestTimedOut):
    """The cluster's metadata store (etcd) did not answer in time: a change that needs it waits,
    then fails with Kafka's retriable REQUEST_TIMED_OUT (as Kafka's admin calls do with no
    controller); reads are served from what the service knows."""


class BrokerNotAvailable(InvalidMetadataError):
    code, name = 8, "BROKER_NOT_AVAILABLE"


class MessageTooLarge(LowtideError):
    code, name = 10, "MESSAGE_TOO_LARGE"


class CoordinatorLoadInProgress(RetriableError):
    # Kafka: the group's offsets are still being read from __consumer_offsets; retry shortly.
    code, name = 14, "COORDINATOR_LOAD_IN_PROGRESS"


class CoordinatorNotAvailable(RetriableError):
    # Kafka: __consumer_offsets (or its partition for the group) cannot be written or read now.
    code, name = 15, "COORDINATOR_NOT_AVAILABLE"


class NotCoordinator(RetriableError):
    # Kafka: this broker is not (or no longer) the coordinator for the key; find it again, retry.
    # Here: this process does not lead the diskless coordinator shard that was called (KIP-1164).
    code, name = 16, "NOT_COORDINATOR"


class NetworkException(InvalidMetadataError):
    # As in Kafka: the broker may have gone away, so the leader may have moved.
    code, name = 13, "NETWORK_EXCEPTION"


class InvalidTopic(LowtideError):
    code, name = 17, "INVALID_TOPIC_EXCEPTION"


class RecordListTooLarge(LowtideError):
    code, name = 18, "RECORD_LIST_TOO_LARGE"


class NotEnoughReplicas(RetriableError):
    code, name = 19, "NOT_ENOUGH_REPLICAS"


class NotEnoughReplicasAfterAppend(RetriableError):
    code, name = 20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND"


class InvalidRequiredAcks(LowtideError):
    code, name = 21, "INVALID_REQUIRED_ACKS"


class IllegalGeneration(LowtideError):
    # Kafka: the generation the member named is not the group's current one; rejoin.
    code, name = 22, "ILLEGAL_GENERATION"


class InconsistentGroupProtocol(LowtideError):
    # Kafka: the protocol type differs from the group's, or no protocol is supported by all members.
    code, name = 23, "INCONSISTENT_GROUP_PROTOCOL"


class InvalidGroupId(LowtideError):
    code, name = 24, "INVALID_GROUP_ID"


class UnknownMemberId(LowtideError):
    # Kafka: the coordinator does not know this member (expired, left, or never joined); rejoin.
    code, name = 25, "UNKNOWN_MEMBER_ID"


class InvalidSessionTimeout(LowtideError):
    code, name = 26, "INVALID_SESSION_TIMEOUT"


class RebalanceInProgress(LowtideError):
    # Not retriable in Kafka's table either: the consumer answers it by rejoining the group.
    code, name = 27, "REBALANCE_IN_PROGRESS"


class TopicAuthorizationFailed(LowtideError):
    code, name = 29, "TOPIC_AUTHORIZATION_FAILED"


class GroupAuthorizationFailed(LowtideError):
    code, name = 30, "GROUP_AUTHORIZATION_FAILED"


class ClusterAuthorizationFailed(LowtideError):
    code, name = 31, "CLUSTER_AUTHORIZATION_FAILED"


class InvalidTimestamp(LowtideError):
    code, name = 32, "INVALID_TIMESTAMP"


class UnsupportedSaslMechanism(LowtideError):
    code, name = 33, "UNSUPPORTED_SASL_MECHANISM"


class IllegalSaslState(LowtideError):
    # Kafka: a SASL request out of order (SaslAuthenticate without a handshake, a second handshake).
    code, name = 34, "ILLEGAL_SASL_STATE"


class TopicAlreadyExists(LowtideError):
    code, name = 36, "TOPIC_ALREADY_EXISTS"


class InvalidPartitions(LowtideError):
    code, name = 37, "INVALID_PARTITIONS"


class InvalidReplicationFactor(LowtideError):
    code, name = 38, "INVALID_REPLICATION_FACTOR"


class InvalidReplicaAssignment(LowtideError):
    code, name = 39, "INVALID_REPLICA_ASSIGNMENT"


class InvalidConfig(LowtideError):
    code, name = 40, "INVALID_CONFIG"


class InvalidRequest(LowtideError):
    code, name = 42, "INVALID_REQUEST"


class UnsupportedForMessageFormat(LowtideError):
    code, name = 43, "UNSUPPORTED_FOR_MESSAGE_FORMAT"


class PolicyViolation(LowtideError):
    code, name = 44, "POLICY_VIOLATION"


class OutOfOrderSequenceNumber(LowtideError):
    code, name = 45, "OUT_OF_ORDER_SEQUENCE_NUMBER"


class DuplicateSequenceNumber(LowtideError):
    code, name = 46, "DUPLICATE_SEQUENCE_NUMBER"


class InvalidProducerEpoch(LowtideError):
    code, name = 47, "INVALID_PRODUCER_EPOCH"


class InvalidTxnState(LowtideError):
    code, name = 48, "INVALID_TXN_STATE"


class InvalidProducerIdMapping(LowtideError):
    code, name = 49, "INVALID_PRODUCER_ID_MAPPING"


class ConcurrentTransactions(RetriableError):
    # Kafka: the transaction is being completed (markers in flight); retry shortly.
    code, name = 51, "CONCURRENT_TRANSACTIONS"


class TransactionCoordinatorFenced(LowtideError):
    code, name = 52, "TRANSACTION_COORDINATOR_FENCED"


class TransactionalIdAuthorizationFailed(LowtideError):
    code, name = 53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


class OperationNotAttempted(LowtideError):
    # Kafka: not tried because another part of the same all-or-nothing request failed.
    code, name = 55, "OPERATION_NOT_ATTEMPTED"


class KafkaStorageError(InvalidMetadataError):
    # Kafka: the replica's log directory failed; the leader will move elsewhere.
    code, name = 56, "KAFKA_STORAGE_ERROR"


class SaslAuthenticationFailed(LowtideError):
    code, name = 58, "SASL_AUTHENTICATION_FAILED"


class NonEmptyGroup(LowtideError):
    code, name = 68, "NON_EMPTY_GROUP"


class GroupIdNotFound(LowtideError):
    code, name = 69, "GROUP_ID_NOT_FOUND"


class FetchSessionIdNotFound(RetriableError):
    """A follower named a fetch session this leader does not hold (it restarted, or a newer session
    of that follower replaced it): the follower opens a new one (KIP-227)."""

    code, name = 70, "FETCH_SESSION_ID_NOT_FOUND"


class InvalidFetchSessionEpoch(RetriableError):
    """A fetch session round out of turn (a resent or stale request): the follower opens a new
    session (KIP-227)."""

    code, name = 71, "INVALID_FETCH_SESSION_EPOCH"


class MemberIdRequired(LowtideError):
    # Kafka JoinGroup v4+: the first join gets a member id with this error and must rejoin with it.
    code, name = 79, "MEMBER_ID_REQUIRED"


class PreferredLeaderNotAvailable(RetriableError):
    # Kafka (KIP-460): the preferred replica is not live or not in the ISR, so it cannot lead now.
    code, name = 80, "PREFERRED_LEADER_NOT_AVAILABLE"


class GroupMaxSizeReached(LowtideError):
    code, name = 81, "GROUP_MAX_SIZE_REACHED"


class NoReassignmentInProgress(LowtideError):
    # Kafka (KIP-455): a cancel (replicas null) for a partition that is not moving.
    code, name = 85, "NO_REASSIGNMENT_IN_PROGRESS"


class InvalidUpdateVersion(LowtideError):
    # Kafka's AlterPartition: the leader's partition epoch is stale (the record moved on).
    code, name = 95, "INVALID_UPDATE_VERSION"


class EligibleLeadersNotAvailable(RetriableError):
    # Kafka (KIP-460): no live replica may lead (lowtide never elects outside the ISR).
    code, name = 83, "ELIGIBLE_LEADERS_NOT_AVAILABLE"


class ElectionNotNeeded(LowtideError):
    # Kafka (KIP-460): the partition's leader already is what the election would choose.
    code, name = 84, "ELECTION_NOT_NEEDED"


class FencedInstanceId(LowtideError):
    # Kafka (KIP-345): another member joined with the same group.instance.id; this one is fenced.
    code, name = 82, "FENCED_INSTANCE_ID"


class GroupSubscribedToTopic(LowtideError):
    # Kafka (KIP-496): OffsetDelete of a topic the group's members are subscribed to.
    code, name = 86, "GROUP_SUBSCRIBED_TO_TOPIC"


class OffsetNotAvailable(RetriableError):
    """A new leader whose HW has not yet reached the start of its leader epoch: the offsets it
    would answer may still move back (Kafka's ``fetchOffsetForTimestamp``); the client retries."""

    code, name = 78, "OFFSET_NOT_AVAILABLE"


class FencedLeaderEpoch(InvalidMetadataError):
    code, name = 74, "FENCED_LEADER_EPOCH"


class UnknownLeaderEpoch(InvalidMetadataError):
    code, name = 75, "UNKNOWN_LEADER_EPOCH"


class UnsupportedCompressionType(LowtideError):
    # Kafka: a codec the broker does not read (KIP-714: a PushTelemetry compressed with a codec
    # GetTelemetrySubscriptions did not offer); the client asks for its subscription again.
    code, name = 76, "UNSUPPORTED_COMPRESSION_TYPE"


class InvalidRecord(LowtideError):
    code, name = 87, "INVALID_RECORD"


class ThrottlingQuotaExceeded(RetriableError):
    # Kafka: a request sooner than its quota allows (KIP-714: a PushTelemetry before the push
    # interval has passed); the client retries after the interval.
    code, name = 89, "THROTTLING_QUOTA_EXCEEDED"


class UnstableOffsetCommit(RetriableError):
    # KIP-447: the group has offsets of an undecided transaction on this partition; retry.
    code, name = 88, "UNSTABLE_OFFSET_COMMIT"


class ProducerFenced(LowtideError):
    # A newer producer with the same transactional id exists (its InitProducerId bumped the epoch).
    code, name = 90, "PRODUCER_FENCED"


class ResourceNotFound(LowtideError):
    # Kafka (KIP-554): e.g. describing or deleting a SCRAM credential that does not exist.
    code, name = 91, "RESOURCE_NOT_FOUND"


class DuplicateResource(LowtideError):
    # Kafka (KIP-554): the same user (and mechanism) twice in one request.
    code, name = 92, "DUPLICATE_RESOURCE"


class UnacceptableCredential(LowtideError):
    # Kafka (KIP-554): a SCRAM credential with too few/many iterations, an empty name or salt.
    code, name = 93, "UNACCEPTABLE_CREDENTIAL"


class UnknownTopicId(InvalidMetadataError):
    # Kafka (KIP-516): no topic has this id here; the caller's metadata is stale.
    code, name = 100, "UNKNOWN_TOPIC_ID"


class TransactionalIdNotFound(LowtideError):
    # Kafka (KIP-664): DescribeTransactions of a transactional id the coordinator has no state for.
    code, name = 105, "TRANSACTIONAL_ID_NOT_FOUND"


class FencedMemberEpoch(LowtideError):
    # Kafka (KIP-848): a ConsumerGroupHeartbeat with a member epoch the coordinator does not
    # expect; the member gives up its partitions and rejoins with epoch 0.
    code, name = 110, "FENCED_MEMBER_EPOCH"


class UnreleasedInstanceId(LowtideError):
    # Kafka (KIP-848): a static member joins with a group.instance.id another member still holds
    # (that member has not left with epoch -2, nor expired).
    code, name = 111, "UNRELEASED_INSTANCE_ID"


class UnsupportedAssignor(LowtideError):
    # Kafka (KIP-848): a ConsumerGroupHeartbeat names a server assignor the coordinator lacks.
    code, name = 112, "UNSUPPORTED_ASSIGNOR"


class StaleMemberEpoch(LowtideError):
    # Kafka (KIP-848): an OffsetCommit/OffsetFetch of a consumer group member with an epoch that
    # is not the member's current one (its heartbeat answer is on its way); retry with it.
    code, name = 113, "STALE_MEMBER_EPOCH"


class UnknownSubscriptionId(LowtideError):
    # Kafka (KIP-714): a PushTelemetry naming a subscription that is no longer the current one; the
    # client gets its subscription again (GetTelemetrySubscriptions) and pushes with the new id.
    code, name = 117, "UNKNOWN_SUBSCRIPTION_ID"


class TelemetryTooLarge(LowtideError):
    # Kafka (KIP-714): a PushTelemetry larger than the subscription's telemetry_max_bytes.
    code, name = 118, "TELEMETRY_TOO_LARGE"


class TransactionAbortable(LowtideError):
    # Kafka (KIP-890): the transaction cannot go on but its producer can: it aborts (EndTxn with
    # committed=false) and starts the next one. AddPartitionsToTxn v5 answers it for a partition
    # a verify-only request finds outside the ongoing transaction.
    code, name = 120, "TRANSACTION_ABORTABLE"


class InvalidRecordState(LowtideError):
    # Kafka (KIP-932): an acknowledgement of records this member has not acquired (not in flight,
    # acquired by another member, or whose acquisition lock timed out). Nothing is changed.
    code, name = 121, "INVALID_RECORD_STATE"


class ShareSessionNotFound(RetriableError):
    # Kafka (KIP-932): a ShareFetch/ShareAcknowledge naming a share session this broker does not
    # hold (evicted, or the broker restarted); the client opens a new one with epoch 0.
    code, name = 122, "SHARE_SESSION_NOT_FOUND"


class InvalidShareSessionEpoch(RetriableError):
    # Kafka (KIP-932): a share session request whose epoch is not the session's next one.
    code, name = 124, "INVALID_SHARE_SESSION_EPOCH"


class ShareSessionLimitReached(RetriableError):
    # Kafka (KIP-932): a new share session at a broker that holds group.share.max.share.sessions
    # already; retriable: idle sessions are forgotten, and members close theirs when they leave.
    code, name = 133, "SHARE_SESSION_LIMIT_REACHED"


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


# One class per Kafka code: a subclass that only refines why (MetadataStoreUnavailable is a
# REQUEST_TIMED_OUT) inherits its parent's code and never stands for it.
_BY_CODE: dict[int, type[LowtideError]] = {c.code: c for c in _all_subclasses(LowtideError)
                                           if c.code >= 0 and "code" in c.__dict__}
_BY_CODE[-1] = UnknownServerError
_BY_NAME: dict[str, type[LowtideError]] = {c.name: c for c in _BY_CODE.values()}


def error_class_for_code(code: int) -> type[LowtideError]:
    return _BY_CODE.get(code, UnknownServerError)


def error_for_code(code: int, message: str = "") -> LowtideError:
    """Build the exception for a Kafka error code (unknown codes become UNKNOWN_SERVER_ERROR)."""
    cls = _BY_CODE.get(code, UnknownServerError)
    return cls(message or (cls.name if code in _BY_CODE else f"error code {code}"))


def error_or_none(code: int, message: str = "") -> LowtideError | None:
    """The error a response's (error_code, error_message) pair carries; None for code 0 (NONE)."""
    return None if code == 0 else error_for_code(int(code), message)


def name_for_code(code: int) -> str:
    """Kafka's error name for a code; 'NONE' for 0."""
    if code == 0:
        return "NONE"
    cls = _BY_CODE.get(code)
    return cls.name if cls else f"UNKNOWN_ERROR_{code}"


def error_for_name(name: str, message: str = "") -> LowtideError:
    cls = _BY_NAME.get(name, UnknownServerError)
    return cls(message)

