"""Transactions over the Kafka protocol (KIP-98): the front door's transaction coordinator answers.

Filled in by issue 34's transaction work.
"""

from __future__ import annotations

from lowtide.kafka.broker import Api

APIS: list[Api] = []
