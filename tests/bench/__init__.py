"""lowtide benchmark suite: ``python -m tests.bench.run [--quick] [--out DIR]`` (``make bench``).

Runs real gRPC against a local cluster of real processes on loopback and reports every figure of
docs/testing.md#targets next to its target and, where one fits, its ratio to a physical reference measured in the
same run (disk bandwidth, loopback gRPC round trip). It reports; it never asserts on time.
"""
