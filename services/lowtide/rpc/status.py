"""The one table between lowtide's errors and gRPC status codes, used in both directions.

Server side (``rpc.interceptor``): a whole-call failure aborts the call with the status of its
error class and details ``"KAFKA_NAME: message"``. Client side (``error_from_rpc``): the Kafka
name at the head of the details gives the error back; a call that failed without one (the server
was unreachable, the deadline passed, a proxy answered) is mapped from its status code.

    error class (and its subclasses)   status                 status without a Kafka name
    ---------------------------------  ---------------------  -----------------------------
    OffsetOutOfRange                   OUT_OF_RANGE           UNAVAILABLE   -> NETWORK_EXCEPTION
    UnknownTopicOrPartition,           NOT_FOUND              DEADLINE_EXCEEDED
      GroupIdNotFound                                                       -> REQUEST_TIMED_OUT
    LeaderNotAvailable, BrokerNot...,  UNAVAILABLE            UNAUTHENTICATED
      NetworkException, NotEnough...                                        -> SASL_AUTHENTICATION_FAILED
    NotLeaderOrFollower, Fenced/Unknown  FAILED_PRECONDITION
      LeaderEpoch, PolicyViolation, ...
    RequestTimedOut                    DEADLINE_EXCEEDED      anything else -> NETWORK_EXCEPTION
    *AuthorizationFailed               PERMISSION_DENIED
    SaslAuthenticationFailed           UNAUTHENTICATED
    TopicAlreadyExists, Duplicate...   ALREADY_EXISTS
    bad input (Invalid*, Corrupt...)   INVALID_ARGUMENT
    anything else                      INTERNAL
"""

from __future__ import annotations

import re

import grpc

from lowtide import errors as e

_S = grpc.StatusCode

# Error class -> status. Looked up along the class's MRO, so a subclass inherits its parent's row.
STATUS_BY_ERROR: dict[type[e.LowtideError], grpc.StatusCode] = {
    e.OffsetOutOfRange: _S.OUT_OF_RANGE,
    e.CorruptMessage: _S.INVALID_ARGUMENT,
    e.UnknownTopicOrPartition: _S.NOT_FOUND,
    e.InvalidFetchSize: _S.INVALID_ARGUMENT,
    e.LeaderNotAvailable: _S.UNAVAILABLE,
    e.NotLeaderOrFollower: _S.FAILED_PRECONDITION,
    e.RequestTimedOut: _S.DEADLINE_EXCEEDED,
    e.BrokerNotAvailable: _S.UNAVAILABLE,
    e.MessageTooLarge: _S.INVALID_ARGUMENT,
    e.CoordinatorLoadInProgress: _S.UNAVAILABLE,
    e.CoordinatorNotAvailable: _S.UNAVAILABLE,
    e.NotCoordinator: _S.UNAVAILABLE,
    e.NetworkException: _S.UNAVAILABLE,
    e.InvalidTopic: _S.INVALID_ARGUMENT,
    e.RecordListTooLarge: _S.INVALID_ARGUMENT,
    e.NotEnoughReplicas: _S.UNAVAILABLE,
    e.NotEnoughReplicasAfterAppend: _S.UNAVAILABLE,
    e.InvalidRequiredAcks: _S.INVALID_ARGUMENT,
    e.IllegalGeneration: _S.FAILED_PRECONDITION,
    e.InconsistentGroupProtocol: _S.FAILED_PRECONDITION,
    e.InvalidGroupId: _S.INVALID_ARGUMENT,
    e.UnknownMemberId: _S.FAILED_PRECONDITION,
    e.InvalidSessionTimeout: _S.INVALID_ARGUMENT,
    e.RebalanceInProgress: _S.ABORTED,
    e.TopicAuthorizationFailed: _S.PERMISSION_DENIED,
    e.GroupAuthorizationFailed: _S.PERMISSION_DENIED,
    e.ClusterAuthorizationFailed: _S.PERMISSION_DENIED,
    e.InvalidTimestamp: _S.INVALID_ARGUMENT,
    e.UnsupportedSaslMechanism: _S.INVALID_ARGUMENT,
    e.IllegalSaslState: _S.FAILED_PRECONDITION,
    e.TopicAlreadyExists: _S.ALREADY_EXISTS,
    e.InvalidPartitions: _S.INVALID_ARGUMENT,
    e.InvalidReplicationFactor: _S.INVALID_ARGUMENT,
    e.InvalidReplicaAssignment: _S.INVALID_ARGUMENT,
    e.PreferredLeaderNotAvailable: _S.UNAVAILABLE,
    e.EligibleLeadersNotAvailable: _S.UNAVAILABLE,
    e.ElectionNotNeeded: _S.FAILED_PRECONDITION,
    e.NoReassignmentInProgress: _S.FAILED_PRECONDITION,
    e.InvalidUpdateVersion: _S.FAILED_PRECONDITION,
    e.InvalidConfig: _S.INVALID_ARGUMENT,
    e.InvalidRequest: _S.INVALID_ARGUMENT,
    e.UnsupportedForMessageFormat: _S.INVALID_ARGUMENT,
    e.PolicyViolation: _S.FAILED_PRECONDITION,
    e.OutOfOrderSequenceNumber: _S.FAILED_PRECONDITION,
    e.DuplicateSequenceNumber: _S.ALREADY_EXISTS,
    e.InvalidProducerEpoch: _S.FAILED_PRECONDITION,
    e.InvalidTxnState: _S.FAILED_PRECONDITION,
    e.TransactionAbortable: _S.FAILED_PRECONDITION,
    e.InvalidProducerIdMapping: _S.FAILED_PRECONDITION,
    e.ConcurrentTransactions: _S.ABORTED,
    e.TransactionCoordinatorFenced: _S.FAILED_PRECONDITION,
    e.TransactionalIdAuthorizationFailed: _S.PERMISSION_DENIED,
    e.OperationNotAttempted: _S.FAILED_PRECONDITION,
    e.KafkaStorageError: _S.INTERNAL,
    e.SaslAuthenticationFailed: _S.UNAUTHENTICATED,
    e.NonEmptyGroup: _S.FAILED_PRECONDITION,
    e.GroupIdNotFound: _S.NOT_FOUND,
    e.MemberIdRequired: _S.FAILED_PRECONDITION,
    e.GroupMaxSizeReached: _S.RESOURCE_EXHAUSTED,
    e.FencedMemberEpoch: _S.FAILED_PRECONDITION,
    e.UnreleasedInstanceId: _S.FAILED_PRECONDITION,
    e.UnsupportedAssignor: _S.INVALID_ARGUMENT,
    e.StaleMemberEpoch: _S.FAILED_PRECONDITION,
    e.FencedInstanceId: _S.FAILED_PRECONDITION,
    e.GroupSubscribedToTopic: _S.FAILED_PRECONDITION,
    e.FencedLeaderEpoch: _S.FAILED_PRECONDITION,
    e.FetchSessionIdNotFound: _S.FAILED_PRECONDITION,
    e.InvalidFetchSessionEpoch: _S.FAILED_PRECONDITION,
    e.UnknownLeaderEpoch: _S.FAILED_PRECONDITION,
    e.OffsetNotAvailable: _S.UNAVAILABLE,
    e.InvalidRecord: _S.INVALID_ARGUMENT,
    e.UnstableOffsetCommit: _S.UNAVAILABLE,
    e.ProducerFenced: _S.FAILED_PRECONDITION,
    e.ResourceNotFound: _S.NOT_FOUND,
    e.DuplicateResource: _S.INVALID_ARGUMENT,
    e.UnacceptableCredential: _S.INVALID_ARGUMENT,
    e.UnknownTopicId: _S.NOT_FOUND,
    e.TransactionalIdNotFound: _S.NOT_FOUND,
    # KIP-714 client telemetry (answered by the Kafka listener itself; rows for completeness).
    e.UnsupportedCompressionType: _S.INVALID_ARGUMENT,
    e.ThrottlingQuotaExceeded: _S.RESOURCE_EXHAUSTED,
    e.UnknownSubscriptionId: _S.FAILED_PRECONDITION,
    e.TelemetryTooLarge: _S.INVALID_ARGUMENT,
    # KIP-932 share groups (answered by a replica's Kafka listener itself; rows for completeness).
    e.InvalidRecordState: _S.FAILED_PRECONDITION,
    e.ShareSessionNotFound: _S.FAILED_PRECONDITION,
    e.InvalidShareSessionEpoch: _S.FAILED_PRECONDITION,
    e.ShareSessionLimitReached: _S.RESOURCE_EXHAUSTED,
}

# A failed call whose details carry no Kafka name: what the status alone means to a client.
ERROR_BY_BARE_STATUS: dict[grpc.StatusCode, type[e.LowtideError]] = {
    _S.UNAVAILABLE: e.NetworkException,
    _S.DEADLINE_EXCEEDED: e.RequestTimedOut,
    _S.UNAUTHENTICATED: e.SaslAuthenticationFailed,
}


def status_for(error: e.LowtideError) -> grpc.StatusCode:
    """The gRPC status a whole-call failure with ``error`` is reported with."""
    for cls in type(error).__mro__:
        status = STATUS_BY_ERROR.get(cls)
        if status is not None:
            return status
    return _S.INTERNAL


def details_for(error: e.LowtideError) -> str:
    """The status details: ``"KAFKA_NAME: message"`` (clients parse the name back)."""
    return f"{error.name}: {error.message}"


def _kafka_name(details: str | None) -> tuple[str, str] | None:
    if details and ":" in details:
        head, _, rest = details.partition(":")
        head = head.strip()
        if head.isupper() and "_" in head:
            return head, rest.strip()
    return None


def error_from_status(status: grpc.StatusCode | None, details: str | None) -> e.LowtideError:
    """The domain error a failed call's (status, details) carried."""
    named = _kafka_name(details)
    if named is not None:
        return e.error_for_name(*named)
    if status == grpc.StatusCode.UNAVAILABLE and details and _TLS_HINTS.search(details):
        return e.NetworkException(
            f"{details} (a TLS mismatch? A plaintext client at a TLS port sees its socket closed: set "
            "ssl.ca.location in --command-config or LOWTIDE_TLS_CA; with mutual TLS also "
            "ssl.certificate.location and ssl.key.location, signed by the server's CA)")
    cls = ERROR_BY_BARE_STATUS.get(status) if status is not None else None
    if cls is not None:
        return cls(details or cls.name)
    # No Kafka name: something between us and a lowtide server failed (transport, proxy).
    return e.NetworkException(f"{status.name if status else 'RPC'}: {details}")


# What gRPC says when the TLS handshake failed or a TLS server closed a plaintext connection.
_TLS_HINTS = re.compile(r"Socket closed|handshake|SSL|certificate|Connection reset", re.IGNORECASE)


def error_from_rpc(exc: grpc.RpcError) -> e.LowtideError:
    """Client side: turn a failed call back into the domain error it carried."""
    details = exc.details() if hasattr(exc, "details") else str(exc)
    status = exc.code() if hasattr(exc, "code") else None
    return error_from_status(status, details)
