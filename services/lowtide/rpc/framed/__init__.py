"""The framed transport: lowtide's small length-prefixed protocol on a plain TCP (or TLS) socket,
used where a gRPC call costs more CPU than the work it carries (issue 32, issue 47): follower
replication rounds, a coordinator's appends to its metadata partition, and brokers' CommitFile
calls to coordinator shards.

Modules, one role each:

* ``codec``: the frames' bytes (the module's top comment draws them), encoding and reading them;
* ``listener``: the server side, a port serving connections on an event loop (HELLO and
  authentication, one request at a time, RESPONSE and ERROR frames);
* ``session``: what a server plugs into a listener: the ``FramedSession`` contract and
  ``FrameDispatcher``, the shared dispatch of frame kinds (and CALL methods) to a server's
  handlers;
* ``connection``: the client side's connections, blocking (``FramedConnection``) and on an event
  loop (``LoopFramedConnection``), and their pool;
* ``callers``: the protocol-level callers a server uses to talk to another server
  (``SocketReplicationStream``, ``ListenerProducer``, ``ListenerCaller``).

Why under ``lowtide.rpc`` rather than a package of its own: ``lowtide.rpc`` is the services'
transport layer (gRPC channels, status mapping, the steps the framed listener runs requests as),
and this is its second transport. It needs nothing ``lowtide.rpc`` may not import (errors,
messages, tls, generated protobuf code), so no new row in the import rules
(tests/unit/test_import_rules.py), and everything above the transport (``lowtide.client``, the
servers) may use it as it uses gRPC. Why not ``lowtide.client``: the callers here are
server-to-server; the public client keeps what an external user calls, and the servers
(``lowtide.replica``, ``lowtide.coordinator``) take their framed callers from here, not from it.

Nothing is imported here: ``import lowtide.client`` never loads the framed transport, and a
server loads only the modules it uses.
"""
