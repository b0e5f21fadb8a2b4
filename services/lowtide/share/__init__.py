"""KIP-932 share groups (issue 49): the share-partition state machine (``state``), its
``__share_group_state`` records (``codec``) and their persistence (``persist``), the share-partitions
a replica leads with their share sessions (``partitions``), and the share group coordinator the
front door runs (``groups``, ``assignor``). Design: docs/design/kip-932-share-groups.md."""
