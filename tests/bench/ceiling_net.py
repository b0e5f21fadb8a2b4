"""The plain-socket side of the transport ceiling (``ceiling.py``): standard library only.

No gRPC, no protobuf, nothing of lowtide is imported here, so a server process is plain Python
and nothing else. A server (``python -m tests.bench.ceiling_net serve``) is one process of an
RF 3 "cluster" of three: server ``i`` leads partition ``i`` and follows the other two, as the
replicas lead the three partitions of a produce topic. Every connection gets a thread.

Wire format, both directions of every connection: after a 1-byte role (``C`` a client, ``F`` a
leader feeding a follower), frames of an 8-byte header ``!II`` (partition, payload length) and
the payload; the answer to each frame is 8 bytes ``!Q`` (the payload length, as an ack).

acks=all: a leader receives a frame from a client, appends the payload to its file of that
partition (``os.write``, ``O_APPEND``, no fsync: as a log segment is written), sends the frame to
both followers (they append it to their own file and ack) and acks the client only after both
followers acked. Buffers are preallocated per connection (``recv_into`` with ``MSG_WAITALL``,
``sendall`` of memoryviews), and sockets are ``TCP_NODELAY``.

``client`` is the load generator (run in the bench's worker processes as ``workers.produce_raw``
is): ``threads`` threads, each with one synchronous request in flight, round-robin over the
partitions' leaders, counting requests acknowledged in the aligned measured window.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

HEADER = struct.Struct("!II")  # partition, payload length
ACK = struct.Struct("!Q")  # payload length appended
ROLE_CLIENT, ROLE_FOLLOWER = b"C", b"F"


def recv_exact(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view`` from ``sock``; False on a clean EOF before the first byte, raises on EOF inside."""
    got, want = 0, len(view)
    while got < want:
        n = sock.recv_into(view[got:], want - got, socket.MSG_WAITALL)
        if n == 0:
            if got == 0:
                return False
            raise ConnectionError(f"peer closed after {got} of {want} bytes")
        got += n
    return True


def _connect(port: int, role: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(role)
    return sock


class Server:
    """One process of the ceiling: leader of partition ``index``, follower of the others."""

    def __init__(self, index: int, directory: Path, partitions: int) -> None:
        self.index = index
        directory.mkdir(parents=True, exist_ok=True)
        # One append-only file per partition this process holds, as one active log segment each.
        self.fds = [os.open(directory / f"partition-{p}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    for p in range(partitions)]
        self.locks = [threading.Lock() for _ in range(partitions)]
        self.peers: list[int] = []
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=256)

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def append(self, partition: int, payload: memoryview) -> None:
        fd = self.fds[partition]
        with self.locks[partition]:
            done = 0
            while done < len(payload):
                done += os.write(fd, payload[done:])

    def serve_forever(self) -> None:
        while True:
            conn, _addr = self.listener.accept()
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        followers: list[socket.socket] = []
        try:
            role = conn.recv(1, socket.MSG_WAITALL)
            if role == ROLE_CLIENT:
                followers = [_connect(port, ROLE_FOLLOWER) for i, port in enumerate(self.peers) if i != self.index]
            elif role != ROLE_FOLLOWER:
                return
            self._frames(conn, followers)
        except OSError:
            pass  # the peer went away (the bench is stopping): this connection ends
        finally:
            for sock in (conn, *followers):
                sock.close()

    def _frames(self, conn: socket.socket, followers: list[socket.socket]) -> None:
        buf = bytearray(HEADER.size + 1024 * 1024 + 64)
        view = memoryview(buf)
        ack = bytearray(ACK.size)
        ack_view = memoryview(ack)
        while True:
            if not recv_exact(conn, view[:HEADER.size]):
                return
            partition, length = HEADER.unpack_from(buf)
            if HEADER.size + length > len(buf):
                buf = bytearray(buf[:HEADER.size]) + bytearray(length)
                view = memoryview(buf)
            frame = view[:HEADER.size + length]
            recv_exact(conn, frame[HEADER.size:])
            self.append(partition, frame[HEADER.size:])
            for follower in followers:  # a leader: forward the whole frame to every follower...
                follower.sendall(frame)
            for follower in followers:  # ...and answer only when all of them have it (acks=all)
                if not recv_exact(follower, ack_view) or ACK.unpack(ack)[0] != length:
                    raise ConnectionError("bad ack from a follower")
            conn.sendall(ACK.pack(length))


def serve(argv: list[str]) -> int:
    """Server process: print the listening port, read the peers' ports (a JSON list, one line),
    print ``ready``, serve until stdin closes (the bench closes it to stop the server)."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.ceiling_net serve")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--partitions", type=int, default=3)
    args = parser.parse_args(argv)
    server = Server(args.index, args.dir, args.partitions)
    print(server.port, flush=True)
    server.peers = [int(p) for p in json.loads(sys.stdin.readline())]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()  # EOF: the bench is done (or died); leave without waiting for the threads
    for fd in server.fds:
        os.close(fd)
    os._exit(0)


def client(spec: dict[str, Any]) -> dict[str, Any]:
    """Send one pre-built frame per request, round-robin over ``targets``, as fast as acked.

    spec: ports (one per server), targets [(server index, partition)], batch (bytes),
    records_per_batch, threads, start_at (epoch s), warmup_s, duration_s. Returns
    bytes/records/requests acknowledged in the window, errors, and request latencies (s)."""
    ports = [int(p) for p in spec["ports"]]
    targets = [(int(s), int(p)) for s, p in spec["targets"]]
    batch: bytes = spec["batch"]
    threads = int(spec["threads"])
    start_at = float(spec["start_at"])
    win_start = start_at + float(spec["warmup_s"])
    win_end = win_start + float(spec["duration_s"])
    frames = {p: HEADER.pack(p, len(batch)) + batch for _s, p in targets}
    lock = threading.Lock()
    totals = {"requests": 0, "errors": 0, "first_error": ""}
    latencies: list[float] = []

    def run(index: int) -> None:
        conns: dict[int, socket.socket] = {}
        ack = bytearray(ACK.size)
        ack_view = memoryview(ack)
        i = index
        try:
            for s in {s for s, _p in targets}:
                conns[s] = _connect(ports[s], ROLE_CLIENT)
            while (now := time.time()) < win_end:
                if now < start_at:
                    time.sleep(start_at - now)
                server, partition = targets[i % len(targets)]
                i += threads
                sock = conns[server]
                began = time.perf_counter()
                sock.sendall(frames[partition])
                if not recv_exact(sock, ack_view) or ACK.unpack(ack)[0] != len(batch):
                    raise ConnectionError("bad ack from the leader")
                elapsed = time.perf_counter() - began
                if win_start <= time.time() < win_end:
                    with lock:
                        totals["requests"] += 1
                        latencies.append(elapsed)
        except OSError as exc:
            with lock:
                totals["errors"] += 1
                totals["first_error"] = totals["first_error"] or repr(exc)
        finally:
            for sock in conns.values():
                sock.close()

    pool = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    n = totals["requests"]
    return {"requests": n, "bytes": n * len(batch), "records": n * int(spec["records_per_batch"]),
            "errors": totals["errors"], "first_error": totals["first_error"], "latencies": latencies}


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        sys.exit("usage: python -m tests.bench.ceiling_net serve --index I --dir DIR [--partitions N]")
    sys.exit(serve(sys.argv[2:]))
