"""The floor under the diskless coordinator's CommitFile latency: the same call on the same
server stack, with no shard behind it.

``python -m tests.bench.grpc_floor --grpc-addr 127.0.0.1:PORT`` serves
``lowtide.v1.DisklessCoordinator`` through ``lowtide.common.server.serve`` (the thread-pool
server, the metrics and error interceptors, health, reflection, frozen start-up objects: what
every coordinator runs), but CommitFile only reads the request's batches and answers one result
per batch. The ``diskless`` bench section calls it with the same client, files and open-loop rate
as the real shard, so the report shows how much of the shard's p99 is the machine plus gRPC in
Python (thread hand-offs, wake-ups) and how much is the shard's own work.
"""

from __future__ import annotations

import argparse

from lowtide.common.logs import configure_logging
from lowtide.common.server import ServiceSpec, serve
from lowtide.messages.commit_wire import pack_results, unpack_batches
from lowtide_pb import coordinator_pb2 as pb
from lowtide_pb import coordinator_pb2_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["DisklessCoordinator"].full_name


class FloorServicer(coordinator_pb2_grpc.DisklessCoordinatorServicer):
    """CommitFile without a shard: every batch read once, every result built as the real one is."""

    def CommitFile(self, request, context):
        if request.packed_batches:  # what DisklessCoordinatorClient sends: read and answer column-wise
            return pb.DisklessCommitFileResponse(packed_results=pack_results(
                (0, row[6], -1, 0, False) for row in unpack_batches(request.packed_batches)))
        reply = pb.DisklessCommitFileResponse()
        add = reply.batches.add
        for b in request.batches:
            add(error_code=0, assigned_base_offset=b.base_offset, log_append_time=-1, log_start_offset=0,
                is_duplicate=False)
        return reply


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.grpc_floor")
    parser.add_argument("--grpc-addr", required=True)
    args = parser.parse_args()
    configure_logging(service="grpc-floor", level="WARNING")
    servicer = FloorServicer()
    serve(ServiceSpec(name="grpc-floor", service_names=[SERVICE_NAME],
                      register=lambda server: coordinator_pb2_grpc.add_DisklessCoordinatorServicer_to_server(
                          servicer, server)),
          grpc_addr=args.grpc_addr, metrics_addr="127.0.0.1:0", grace_seconds=1.0)


if __name__ == "__main__":
    main()
