"""The orphan scanner (KIP-1164 "Orphan files"): finds WAL files no coordinator shard knows."""
