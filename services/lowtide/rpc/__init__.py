"""The gRPC boundary: the one error <-> status table, channels, the server's error interceptor and
the conversions between domain types and generated messages that more than one side needs.

Only ``lowtide.rpc``, ``lowtide.client`` and the servicer/server modules import the generated
``lowtide_pb`` code (``tests/unit/test_import_rules.py`` enforces it).
"""
