"""Kafka's murmur2 partitioner, checked against Kafka's published values and kafka-python."""

from __future__ import annotations

import os

from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from lowtide.client.partitioner import murmur2, partition_for_key


def test_murmur2_matches_kafkas_utils_test_values():
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829, b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
             bytes([ord("a"), ord("b"), ord("c")]): 479470107}
    for data, expected in cases.items():
        assert murmur2(data) == expected


def test_murmur2_matches_kafka_python_for_random_keys():
    for n in range(64):
        data = os.urandom(n)
        assert murmur2(data) & 0xFFFFFFFF == kafka_python_murmur2(data) & 0xFFFFFFFF


def test_partition_is_the_positive_hash_modulo_partitions():
    assert partition_for_key(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
