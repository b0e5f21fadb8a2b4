"""Cluster metadata (topics, partition leaders/ISR, brokers) kept in Redis."""
