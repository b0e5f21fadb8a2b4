"""What one small request/answer round costs in CPU: on a gRPC stream (grpcio's thread-pool
server) against a length-prefixed frame on a plain socket (lowtide.rpc.framed's shape).

``python -m tests.bench.round_cost [--rounds 3000] [--request-bytes 200] [--answer-bytes 5000]``

A server process answers every request with ``--answer-bytes``; one client thread sends
``--rounds`` requests on one stream (or one socket), each after the previous answer, as a follower
does. Prints, per round, the wall time and the CPU (utime + stime from /proc) of the client and of
the server. The measurement behind the replication listener
(docs/design/kip-107-delete-records.md#replication-and-the-low-watermark).
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import struct
import sys
import threading
import time
from concurrent import futures

import grpc

_LENGTH = struct.Struct(">I")


def _identity(b: bytes) -> bytes:
    return b


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(transport: str, answer: bytes, ready_fd: int) -> None:
    """The server process: writes its port to ``ready_fd``, serves until killed."""
    if transport == "grpc":
        def stream(requests, _context):
            for _ in requests:
                yield answer
        server = grpc.server(futures.ThreadPoolExecutor(8))
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "bench.Rounds", {"Stream": grpc.stream_stream_rpc_method_handler(stream, _identity, _identity)})])
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]

        def connection(conn: socket.socket) -> None:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = conn.makefile("rb")
            while header := reader.read(4):
                reader.read(_LENGTH.unpack(header)[0])
                conn.sendall(_LENGTH.pack(len(answer)) + answer)

        def accept() -> None:
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=connection, args=(conn,), daemon=True).start()
        threading.Thread(target=accept, daemon=True).start()
    os.write(ready_fd, f"{port}\n".encode())
    threading.Event().wait()


def measure(transport: str, *, rounds: int, request_bytes: int, answer_bytes: int) -> dict[str, float]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            _serve(transport, b"a" * answer_bytes, write_fd)
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        port = int(os.read(read_fd, 64).split()[0])
        request = b"r" * request_bytes
        if transport == "grpc":
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            requests: queue.SimpleQueue = queue.SimpleQueue()
            answers = channel.stream_stream("/bench.Rounds/Stream", request_serializer=_identity,
                                            response_deserializer=_identity)(iter(requests.get, None))

            def round_trip() -> bytes:
                requests.put(request)
                return next(answers)
        else:
            conn = socket.create_connection(("127.0.0.1", port))
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = conn.makefile("rb")

            def round_trip() -> bytes:
                conn.sendall(_LENGTH.pack(len(request)) + request)
                return reader.read(_LENGTH.unpack(reader.read(4))[0])
        for _ in range(200):  # warm up: connections, threads, allocator
            round_trip()
        me = os.getpid()
        client0, server0, began = _cpu_s(me), _cpu_s(pid), time.perf_counter()
        for _ in range(rounds):
            round_trip()
        wall = time.perf_counter() - began
        client, server = _cpu_s(me) - client0, _cpu_s(pid) - server0
        return {"wall_us": wall / rounds * 1e6, "client_cpu_us": client / rounds * 1e6,
                "server_cpu_us": server / rounds * 1e6}
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--request-bytes", type=int, default=200)
    parser.add_argument("--answer-bytes", type=int, default=5000)
    args = parser.parse_args(argv)
    for transport in ("grpc", "socket"):
        r = measure(transport, rounds=args.rounds, request_bytes=args.request_bytes, answer_bytes=args.answer_bytes)
        client, server = r["client_cpu_us"], r["server_cpu_us"]
        print(f"{transport:>6}: {r['wall_us']:.0f} us wall per round; CPU per round: "
              f"client {client:.0f} us, server {server:.0f} us, sum {client + server:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
