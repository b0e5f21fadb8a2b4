"""The diskless coordinator (KIP-1164): metadata records, SQLite state, and the domain core of the
seven operations (``core.CoordinatorCore``). No gRPC here: the servicer converts protobuf messages
(protos/lowtide/v1/coordinator.proto) to the dataclasses of ``messages``."""
