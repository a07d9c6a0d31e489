"""Security (issue 12): principals, ACLs and the ZooKeeper-backed AclAuthorizer, SASL/SCRAM,
TLS listeners and ZooKeeper ACLs. One concept per module; see each module's docstring."""
