"""Encoded Metadata answers are served again only while this process saw no newer store revision
(lowtide/kafka/metadata_responses.py)."""

from __future__ import annotations

from lowtide.kafka.metadata_responses import MetadataResponses
from lowtide.kafka.protocol import EncodedBody


def test_an_answer_is_served_again_until_the_process_sees_a_newer_revision():
    seen = [10]
    kept = MetadataResponses(revision=lambda: seen[0])
    body = EncodedBody(b"answer", flexible=True)
    assert kept.get(("v12", None)) is None
    kept.put(("v12", None), revision=11, body=body)  # the front door was a step ahead of us
    assert kept.get(("v12", None)) is body
    seen[0] = 11
    assert kept.get(("v12", None)) is body
    seen[0] = 12  # a leader moved, an ISR changed...: built again
    assert kept.get(("v12", None)) is None
    assert (kept.hits, kept.misses) == (2, 2)


def test_an_answer_of_unknown_revision_is_not_kept_and_the_oldest_goes_past_the_bound():
    kept = MetadataResponses(revision=lambda: 1, max_entries=2)
    kept.put("unknown", revision=0, body=EncodedBody(b"x", flexible=False))
    assert kept.get("unknown") is None
    for key in ("a", "b"):
        kept.put(key, revision=5, body=EncodedBody(key.encode(), flexible=False))
    assert kept.get("a") is not None  # a is now the most recently used
    kept.put("c", revision=5, body=EncodedBody(b"c", flexible=False))
    assert kept.get("b") is None and kept.get("a") is not None and kept.get("c") is not None
