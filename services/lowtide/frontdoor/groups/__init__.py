"""The group coordinator role: Kafka's consumer groups at the front door. It owns committed
offsets in ``__consumer_offsets`` (OffsetCommit/Fetch/Delete, List/Describe/DeleteGroups:
``groups.py`` over ``offsets_topic.py``; the one-time move from Redis: ``offsets_migration.py``),
classic group membership in this process's memory (Join/Sync/Heartbeat/LeaveGroup:
``membership.py`` around ``classic_group.py``), KIP-848 consumer groups (``consumer_membership.py``
around ``consumer_group.py``) and the online migration between the two (``classic_members.py``).
The offsets' record format and fold are the top-level ``lowtide.groups``, shared with the
replicas; from the other roles it takes only ``admin``'s ``TopicAdmin``, to create its topic."""
