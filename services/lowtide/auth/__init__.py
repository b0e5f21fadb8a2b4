"""Authentication (bearer tokens -> principals) and KIP-11 style authorization; ACLs, token digests
and SCRAM credentials are kept in the cluster metadata (etcd)."""
