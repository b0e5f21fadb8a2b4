"""Starting a Kafka protocol listener inside a lowtide service (replica server, front door).

``--kafka-listener HOST:PORT`` (env ``LOWTIDE_KAFKA_LISTENER``; unset = no listener; port 0 = any
free port), ``--kafka-max-request-bytes`` (Kafka's ``socket.request.max.bytes``) and
``--kafka-connections-max-reauth-ms`` (Kafka's ``connections.max.reauth.ms``: how long a SASL/SCRAM
login's session lasts before the client must re-authenticate; apis_sasl.py). A replica
server also needs ``--frontdoor-addr``: its listener forwards cluster, topic, group and
DeleteRecords requests there.

The port is bound before the service registers (a replica advertises it in its broker record),
and the handlers are attached once the service's servicers exist; a request arriving in between
is refused by closing its connection, as a broker that is still starting does.
"""

from __future__ import annotations

import argparse
import threading

from lowtide.common.server import add_flag, split_addr
from lowtide.kafka import (
    apis_admin,
    apis_cluster,
    apis_configs,
    apis_data,
    apis_groups,
    apis_sasl,
    apis_scram,
    apis_txn,
)
from lowtide.kafka.broker import Api, KafkaBroker
from lowtide.kafka.listener import Connection, KafkaListener
from lowtide.kafka.protocol import DEFAULT_MAX_REQUEST_BYTES, FrameError, RequestHead

# Kafka's connections.max.reauth.ms is 0 (sessions never end) by default; lowtide's SCRAM sessions
# stand for a minted token, which must end, so they last an hour and clients re-authenticate.
DEFAULT_SESSION_LIFETIME_MS = 3_600_000


def all_apis() -> list[Api]:
    """Every API the Kafka listener serves, with its version range."""
    return [*apis_data.APIS, *apis_admin.APIS, *apis_groups.APIS, *apis_sasl.APIS, *apis_configs.APIS, *apis_scram.APIS,
            *apis_txn.APIS, *apis_cluster.APIS]


def add_kafka_flags(parser: argparse.ArgumentParser, *, needs_frontdoor: bool) -> None:
    add_flag(parser, "--kafka-listener", default=None,
             help="HOST:PORT of the Kafka protocol listener (unset = none; port 0 = any free port)")
    add_flag(parser, "--kafka-max-request-bytes", default=DEFAULT_MAX_REQUEST_BYTES, type=int,
             help="largest Kafka request frame accepted (Kafka's socket.request.max.bytes)")
    add_flag(parser, "--kafka-workers", default=64, type=int, help="threads handling Kafka requests")
    add_flag(parser, "--kafka-connections-max-reauth-ms", default=DEFAULT_SESSION_LIFETIME_MS, type=int,
             help="lifetime of a SASL/SCRAM login's session (Kafka's connections.max.reauth.ms): clients "
                  "re-authenticate before it ends, else their connection is closed (at least 1000)")
    if needs_frontdoor:
        add_flag(parser, "--frontdoor-addr", default=None,
                 help="gRPC address of the front door, where the Kafka listener sends admin and group requests")


class KafkaEndpoint:
    """A bound listener whose broker is attached later (``attach``)."""

    def __init__(self, *, address: str, max_request_bytes: int, workers: int, name: str) -> None:
        host, port = split_addr(address)
        self._broker: KafkaBroker | None = None
        self._ready = threading.Event()
        self.listener = KafkaListener(host=host, port=port, dispatch=self._dispatch,
                                      max_request_bytes=max_request_bytes, workers=workers, name=name)
        self.port = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, name: str) -> KafkaEndpoint | None:
        if not args.kafka_listener:
            return None
        return cls(address=args.kafka_listener, max_request_bytes=args.kafka_max_request_bytes,
                   workers=args.kafka_workers, name=name)

    def start(self) -> int:
        self.port = self.listener.start()
        return self.port

    def attach(self, broker: KafkaBroker) -> None:
        self._broker = broker
        self._ready.set()

    def stop(self) -> None:
        self.listener.stop()

    def _dispatch(self, conn: Connection, head: RequestHead, payload: bytes) -> bytes | None:
        if not self._ready.wait(timeout=10):
            raise FrameError("the service is still starting")
        return self._broker(conn, head, payload)
