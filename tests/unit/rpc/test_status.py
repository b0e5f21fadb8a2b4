"""The one error <-> gRPC status table: both directions agree for every error lowtide defines."""

from __future__ import annotations

import grpc
import pytest

from lowtide import errors
from lowtide.rpc.status import STATUS_BY_ERROR, details_for, error_from_status, status_for

ALL_ERRORS = sorted((c for c in errors._BY_CODE.values() if c is not errors.UnknownServerError),  # noqa: SLF001
                    key=lambda c: c.code)


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.name)
def test_every_error_has_a_row_and_comes_back_as_itself(cls):
    assert cls in STATUS_BY_ERROR
    err = cls("partition orders-0: details")
    back = error_from_status(status_for(err), details_for(err))
    assert type(back) is cls and back.message == "partition orders-0: details"


def test_the_details_carry_the_kafka_name_first():
    assert details_for(errors.OffsetOutOfRange("offset 7 > hw 5")) == "OFFSET_OUT_OF_RANGE: offset 7 > hw 5"
    assert status_for(errors.NotLeaderOrFollower()) is grpc.StatusCode.FAILED_PRECONDITION
    assert status_for(errors.UnknownServerError()) is grpc.StatusCode.INTERNAL


@pytest.mark.parametrize(("status", "expected"), [
    (grpc.StatusCode.UNAVAILABLE, errors.NetworkException),
    (grpc.StatusCode.DEADLINE_EXCEEDED, errors.RequestTimedOut),
    (grpc.StatusCode.UNAUTHENTICATED, errors.SaslAuthenticationFailed),
    (grpc.StatusCode.INTERNAL, errors.NetworkException),
])
def test_a_status_without_a_kafka_name_maps_by_its_code(status, expected):
    assert type(error_from_status(status, "connection refused")) is expected


def test_behaviour_attributes_follow_kafka():
    assert errors.NotLeaderOrFollower.invalid_metadata and errors.NotLeaderOrFollower.retriable
    assert errors.NetworkException.invalid_metadata
    assert errors.NotEnoughReplicas.retriable and not errors.NotEnoughReplicas.invalid_metadata
    assert errors.RequestTimedOut.retriable and not errors.RequestTimedOut.invalid_metadata
    assert not errors.OffsetOutOfRange.retriable and not errors.PolicyViolation.retriable
    # invalid_metadata implies retriable, for every error
    assert all(c.retriable for c in ALL_ERRORS if c.invalid_metadata)


@pytest.mark.parametrize("details", ["failed to connect to all addresses; last error: UNAVAILABLE: "
                                     "ipv4:127.0.0.1:4000: Socket closed",
                                     "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:4000: "
                                     "Ssl handshake failed: SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED"])
def test_a_refused_tls_connection_says_how_to_configure_tls(details):
    err = error_from_status(grpc.StatusCode.UNAVAILABLE, details)
    assert isinstance(err, errors.NetworkException) and err.retriable
    assert details in err.message and "ssl.ca.location" in err.message


def test_an_unavailable_server_without_tls_symptoms_gets_no_tls_hint():
    err = error_from_status(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; Connection refused")
    assert isinstance(err, errors.NetworkException) and "ssl" not in err.message
