"""Protobuf <-> ``lowtide.messages``, one module per service area, both directions in one place.

A servicer unpacks its request and packs its answer with these; the remote parts of
``lowtide.client.frontdoor`` do the reverse with the same module. Each pair is tested as a round
trip (tests/unit/rpc/convert)."""
