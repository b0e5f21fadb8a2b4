"""Diskless topics on the brokers (KIP-1164): WAL files, produce buffering and commits, fetch."""
