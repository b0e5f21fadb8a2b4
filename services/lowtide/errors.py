"""The one exception root of lowtide, with Kafka's error names and codes.

Every domain error is a ``LowtideError`` subclass carrying behaviour attributes:

* ``code``       Kafka's numeric error code (``org.apache.kafka.common.protocol.Errors``)
* ``name``       Kafka's error name, e.g. ``OFFSET_OUT_OF_RANGE``
* ``retriable``  whether retrying the same request may succeed
* ``grpc_status`` the gRPC status a whole-call failure maps to (see ``common.interceptor``)

Per-partition results carry (code, message) pairs built with ``error.code``/``str(error)``;
whole-call failures are raised and mapped to a gRPC status in one interceptor.
"""

from __future__ import annotations

import grpc


class LowtideError(Exception):
    code: int = -1
    name: str = "UNKNOWN_SERVER_ERROR"
    retriable: bool = False
    grpc_status: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.name)
        self.message = message or self.name


class UnknownServerError(LowtideError):
    pass


class OffsetOutOfRange(LowtideError):
    code, name, grpc_status = 1, "OFFSET_OUT_OF_RANGE", grpc.StatusCode.OUT_OF_RANGE


class CorruptMessage(LowtideError):
    code, name, retriable, grpc_status = 2, "CORRUPT_MESSAGE", True, grpc.StatusCode.INVALID_ARGUMENT


class UnknownTopicOrPartition(LowtideError):
    code, name, retriable, grpc_status = 3, "UNKNOWN_TOPIC_OR_PARTITION", True, grpc.StatusCode.NOT_FOUND


class InvalidFetchSize(LowtideError):
    code, name, grpc_status = 4, "INVALID_FETCH_SIZE", grpc.StatusCode.INVALID_ARGUMENT


class LeaderNotAvailable(LowtideError):
    code, name, retriable, grpc_status = 5, "LEADER_NOT_AVAILABLE", True, grpc.StatusCode.UNAVAILABLE


class NotLeaderOrFollower(LowtideError):
    code, name, retriable, grpc_status = 6, "NOT_LEADER_OR_FOLLOWER", True, grpc.StatusCode.FAILED_PRECONDITION


class RequestTimedOut(LowtideError):
    code, name, retriable, grpc_status = 7, "REQUEST_TIMED_OUT", True, grpc.StatusCode.DEADLINE_EXCEEDED


class BrokerNotAvailable(LowtideError):
    code, name, retriable, grpc_status = 8, "BROKER_NOT_AVAILABLE", True, grpc.StatusCode.UNAVAILABLE


class MessageTooLarge(LowtideError):
    code, name, grpc_status = 10, "MESSAGE_TOO_LARGE", grpc.StatusCode.INVALID_ARGUMENT


class NetworkException(LowtideError):
    code, name, retriable, grpc_status = 13, "NETWORK_EXCEPTION", True, grpc.StatusCode.UNAVAILABLE


class InvalidTopic(LowtideError):
    code, name, grpc_status = 17, "INVALID_TOPIC_EXCEPTION", grpc.StatusCode.INVALID_ARGUMENT


class RecordListTooLarge(LowtideError):
    code, name, grpc_status = 18, "RECORD_LIST_TOO_LARGE", grpc.StatusCode.INVALID_ARGUMENT


class NotEnoughReplicas(LowtideError):
    code, name, retriable, grpc_status = 19, "NOT_ENOUGH_REPLICAS", True, grpc.StatusCode.UNAVAILABLE


class NotEnoughReplicasAfterAppend(LowtideError):
    code, name, retriable = 20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", True
    grpc_status = grpc.StatusCode.UNAVAILABLE


class InvalidRequiredAcks(LowtideError):
    code, name, grpc_status = 21, "INVALID_REQUIRED_ACKS", grpc.StatusCode.INVALID_ARGUMENT


class InvalidGroupId(LowtideError):
    code, name, grpc_status = 24, "INVALID_GROUP_ID", grpc.StatusCode.INVALID_ARGUMENT


class TopicAuthorizationFailed(LowtideError):
    code, name, grpc_status = 29, "TOPIC_AUTHORIZATION_FAILED", grpc.StatusCode.PERMISSION_DENIED


class GroupAuthorizationFailed(LowtideError):
    code, name, grpc_status = 30, "GROUP_AUTHORIZATION_FAILED", grpc.StatusCode.PERMISSION_DENIED


class ClusterAuthorizationFailed(LowtideError):
    code, name, grpc_status = 31, "CLUSTER_AUTHORIZATION_FAILED", grpc.StatusCode.PERMISSION_DENIED


class InvalidTimestamp(LowtideError):
    code, name, grpc_status = 32, "INVALID_TIMESTAMP", grpc.StatusCode.INVALID_ARGUMENT


class TopicAlreadyExists(LowtideError):
    code, name, grpc_status = 36, "TOPIC_ALREADY_EXISTS", grpc.StatusCode.ALREADY_EXISTS


class InvalidPartitions(LowtideError):
    code, name, grpc_status = 37, "INVALID_PARTITIONS", grpc.StatusCode.INVALID_ARGUMENT


class InvalidReplicationFactor(LowtideError):
    code, name, grpc_status = 38, "INVALID_REPLICATION_FACTOR", grpc.StatusCode.INVALID_ARGUMENT


class InvalidConfig(LowtideError):
    code, name, grpc_status = 40, "INVALID_CONFIG", grpc.StatusCode.INVALID_ARGUMENT


class InvalidRequest(LowtideError):
    code, name, grpc_status = 42, "INVALID_REQUEST", grpc.StatusCode.INVALID_ARGUMENT


class UnsupportedForMessageFormat(LowtideError):
    code, name, grpc_status = 43, "UNSUPPORTED_FOR_MESSAGE_FORMAT", grpc.StatusCode.INVALID_ARGUMENT


class PolicyViolation(LowtideError):
    code, name, grpc_status = 44, "POLICY_VIOLATION", grpc.StatusCode.FAILED_PRECONDITION


class OutOfOrderSequenceNumber(LowtideError):
    code, name, grpc_status = 45, "OUT_OF_ORDER_SEQUENCE_NUMBER", grpc.StatusCode.FAILED_PRECONDITION


class DuplicateSequenceNumber(LowtideError):
    code, name, grpc_status = 46, "DUPLICATE_SEQUENCE_NUMBER", grpc.StatusCode.ALREADY_EXISTS


class InvalidProducerEpoch(LowtideError):
    code, name, grpc_status = 47, "INVALID_PRODUCER_EPOCH", grpc.StatusCode.FAILED_PRECONDITION


class KafkaStorageError(LowtideError):
    code, name, retriable, grpc_status = 56, "KAFKA_STORAGE_ERROR", True, grpc.StatusCode.INTERNAL


class SaslAuthenticationFailed(LowtideError):
    code, name, grpc_status = 58, "SASL_AUTHENTICATION_FAILED", grpc.StatusCode.UNAUTHENTICATED


class NonEmptyGroup(LowtideError):
    code, name, grpc_status = 68, "NON_EMPTY_GROUP", grpc.StatusCode.FAILED_PRECONDITION


class GroupIdNotFound(LowtideError):
    code, name, grpc_status = 69, "GROUP_ID_NOT_FOUND", grpc.StatusCode.NOT_FOUND


class FencedLeaderEpoch(LowtideError):
    code, name, retriable, grpc_status = 74, "FENCED_LEADER_EPOCH", True, grpc.StatusCode.FAILED_PRECONDITION


class UnknownLeaderEpoch(LowtideError):
    code, name, retriable, grpc_status = 75, "UNKNOWN_LEADER_EPOCH", True, grpc.StatusCode.FAILED_PRECONDITION


class InvalidRecord(LowtideError):
    code, name, grpc_status = 87, "INVALID_RECORD", grpc.StatusCode.INVALID_ARGUMENT


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


_BY_CODE: dict[int, type[LowtideError]] = {c.code: c for c in _all_subclasses(LowtideError)}
_BY_CODE[-1] = UnknownServerError
_BY_NAME: dict[str, type[LowtideError]] = {c.name: c for c in _BY_CODE.values()}


def error_for_code(code: int, message: str = "") -> LowtideError:
    """Build the exception for a Kafka error code (unknown codes become UNKNOWN_SERVER_ERROR)."""
    cls = _BY_CODE.get(code, UnknownServerError)
    return cls(message or (cls.name if code in _BY_CODE else f"error code {code}"))


def name_for_code(code: int) -> str:
    """Kafka's error name for a code; 'NONE' for 0."""
    if code == 0:
        return "NONE"
    cls = _BY_CODE.get(code)
    return cls.name if cls else f"UNKNOWN_ERROR_{code}"


def error_for_name(name: str, message: str = "") -> LowtideError:
    cls = _BY_NAME.get(name, UnknownServerError)
    return cls(message)
