"""Protobuf <-> ``lowtide.messages``, one module per service area, both directions in one place.

A servicer unpacks its request and packs its answer with these; the remote parts of
``lowtide.client.frontdoor`` do the reverse with the same module. Each pair is tested as a round
trip (tests/unit/rpc/convert)."""

from lowtide.errors import LowtideError


def error_fields(error: LowtideError | None) -> tuple[int, str]:
    """(error_code, error_message) of an answer: (0, "") for success."""
    return (0, "") if error is None else (error.code, error.message)


def error_kwargs(error: LowtideError | None) -> dict:
    """An answer's ``error_code=``/``error_message=`` fields (none for success: proto3's defaults)."""
    return {} if error is None else {"error_code": error.code, "error_message": error.message}
