"""Unit tests of the replica's KIP-107 rules: partitions over real logs in tmp_path, no processes, no Redis."""
