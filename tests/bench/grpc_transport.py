"""What gRPC itself costs per MiB in Python: unary calls vs. bidirectional streams, on the
thread-pool server (``grpc.server``) and on ``grpc.aio``.

``python -m tests.bench.grpc_transport [--messages 400] [--threads 4]``

A server process with one unary and one stream-stream method (raw bytes, no protobuf) answers
every 1 MiB message with 2 bytes; ``--threads`` client threads send ``--messages`` messages in all,
each thread as unary calls or as one stream. Prints MiB/s and the CPU (utime + stime from /proc)
the server and the client spent per MiB. This is the measurement behind the
"Replication transport" choice of docs/design/kip-107-delete-records.md: which shape of call to put replication on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from concurrent import futures

import grpc

MiB = 1 << 20
OPTIONS = [("grpc.max_receive_message_length", 64 * MiB), ("grpc.max_send_message_length", 64 * MiB)]


def _identity(b: bytes) -> bytes:
    return b


def _handlers(unary, stream) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler("bench.Transport", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, _identity, _identity),
        "Stream": grpc.stream_stream_rpc_method_handler(stream, _identity, _identity)})


def _serve_threads(ready_fd: int) -> None:
    def unary(request, context):
        return b"ok"

    def stream(requests, context):
        for _ in requests:
            yield b"ok"

    server = grpc.server(futures.ThreadPoolExecutor(16), options=OPTIONS)
    server.add_generic_rpc_handlers((_handlers(unary, stream),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    os.write(ready_fd, f"{port}\n".encode())
    server.wait_for_termination()


def _serve_aio(ready_fd: int) -> None:
    async def unary(request, context):
        return b"ok"

    async def stream(requests, context):
        async for _ in requests:
            yield b"ok"

    async def main() -> None:
        server = grpc.aio.server(options=OPTIONS)
        server.add_generic_rpc_handlers((_handlers(unary, stream),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        os.write(ready_fd, f"{port}\n".encode())
        await server.wait_for_termination()

    asyncio.run(main())


def _cpu_ms(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _load(port: int, shape: str, *, messages: int, threads: int) -> float:
    payload = os.urandom(MiB)
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS) as channel:
        unary = channel.unary_unary("/bench.Transport/Unary", _identity, _identity)
        stream = channel.stream_stream("/bench.Transport/Stream", _identity, _identity)
        per_thread = messages // threads

        def work() -> None:
            if shape == "unary":
                for _ in range(per_thread):
                    unary(payload)
            else:
                for _ in stream(payload for _ in range(per_thread)):
                    pass

        workers = [threading.Thread(target=work) for _ in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - start


def measure(server: str, shape: str, *, messages: int, threads: int) -> dict[str, float]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the server process
        os.close(read_fd)
        try:
            (_serve_threads if server == "threads" else _serve_aio)(write_fd)
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd) as ready:
            port = int(ready.readline())
        _load(port, shape, messages=max(threads, messages // 4), threads=threads)  # warm-up
        server_before, client_before = _cpu_ms(pid), time.process_time()
        elapsed = _load(port, shape, messages=messages, threads=threads)
        server_ms, client_ms = _cpu_ms(pid) - server_before, (time.process_time() - client_before) * 1000
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return {"mib_s": messages / elapsed, "server_ms_per_mib": server_ms / messages,
            "client_ms_per_mib": client_ms / messages}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args(argv)
    print(f"{'server':<8} {'shape':<7} {'MiB/s':>7} {'server ms/MiB':>14} {'client ms/MiB':>14}")
    for server in ("threads", "aio"):
        for shape in ("unary", "stream"):
            r = measure(server, shape, messages=args.messages, threads=args.threads)
            print(f"{server:<8} {shape:<7} {r['mib_s']:>7.0f} {r['server_ms_per_mib']:>14.2f} "
                  f"{r['client_ms_per_mib']:>14.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
