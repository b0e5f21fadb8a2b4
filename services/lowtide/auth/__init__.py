"""Authentication (bearer tokens -> principals) and KIP-11 style authorization (ACLs in Redis)."""
