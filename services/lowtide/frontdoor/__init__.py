"""The front door: the Admin gRPC service (topics, metadata, DeleteRecords fan-out, groups, ACLs)."""
