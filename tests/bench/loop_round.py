"""What one framed request/answer round costs in CPU on each event loop lowtide can run
(lowtide/rpc/loops.py): a real FramedListener in a server process answering 5,000 bytes, and a
LoopFramedConnection client sending 200-byte requests one after the other, as a follower does.

``python -m tests.bench.loop_round [--rounds 20000] [--pairs 3]``

Runs asyncio's loop and uvloop alternately (both sides the same kind, chosen by
LOWTIDE_EVENT_LOOP in each process) and prints, per round, the wall time and the CPU
(utime + stime from /proc) of the client and of the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ANSWER_BYTES = 5000
REQUEST_BYTES = 200


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Echo:
    """Answers every request with ANSWER_BYTES."""

    def handle_steps(self, kind: int, payload: bytes):
        return b"a" * ANSWER_BYTES
        yield  # a generator: the listener drives it as steps

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


def _serve() -> None:
    from lowtide.rpc.framed_listener import FramedListener

    server = FramedListener(host="127.0.0.1", port=0, tls=None, name="bench")
    port = server.bind()
    server.start(open_session=lambda principal, peer: _Echo(), authenticate=lambda metadata, cert: "User:bench",
                 draining=lambda: False)
    print(port, flush=True)
    threading.Event().wait()


def _measure(rounds: int) -> str:
    from lowtide.client.framed import LoopFramedConnection
    from lowtide.rpc.framed import REQUEST
    from lowtide.rpc.loops import loop_kind, new_event_loop
    from lowtide.rpc.steps import drive_to_future

    server = subprocess.Popen([sys.executable, "-m", "tests.bench.loop_round", "--serve"], stdout=subprocess.PIPE,
                              text=True)
    loop = new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        port = int(server.stdout.readline())

        def run(make_steps):
            async def drive():
                return await drive_to_future(make_steps(), loop=loop, executor=pool)
            return asyncio.run_coroutine_threadsafe(drive(), loop).result(timeout=120)

        connection = run(lambda: LoopFramedConnection.open_steps(f"127.0.0.1:{port}", loop=loop, tls=None,
                                                                 metadata=[], connect_timeout_s=5))
        request = b"r" * REQUEST_BYTES

        def calls(n: int):
            for _ in range(n):
                yield from connection.call_steps(REQUEST, request, timeout_s=10)

        run(lambda: calls(500))  # warm-up
        client0, server0, wall0 = _cpu_s(os.getpid()), _cpu_s(server.pid), time.perf_counter()
        run(lambda: calls(rounds))
        client1, server1, wall1 = _cpu_s(os.getpid()), _cpu_s(server.pid), time.perf_counter()
        loop.call_soon_threadsafe(connection.close)
        per_round = [(after - before) / rounds * 1e6 for before, after in
                     ((wall0, wall1), (client0, client1), (server0, server1))]
        return (f"{loop_kind():8} wall {per_round[0]:5.0f} us/round; CPU per round: client {per_round[1]:4.0f} us, "
                f"server {per_round[2]:4.0f} us")
    finally:
        server.kill()
        server.wait()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        pool.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve()
        return 0
    if args.measure:
        print(_measure(args.rounds), flush=True)
        return 0
    for _ in range(args.pairs):
        for kind in ("asyncio", "uvloop"):
            env = dict(os.environ, LOWTIDE_EVENT_LOOP=kind)
            subprocess.run([sys.executable, "-m", "tests.bench.loop_round", "--measure", "--rounds", str(args.rounds)],
                           env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
