"""The Admin API role: request handlers that check a caller's rights and change or describe the
cluster's configuration in the metadata store, then answer; nothing here runs in the background.
It owns topics (create, delete, Metadata, ListOffsets: ``admin.py``; diskless topics' side of
them: ``diskless.py``), topic configs (``topic_config.py``, ``config_admin.py``), CreatePartitions,
DeleteRecords fan-out, ACLs and SCRAM credentials. It imports no other role; the group and
transaction coordinators use its ``TopicAdmin`` to create their internal topics."""
