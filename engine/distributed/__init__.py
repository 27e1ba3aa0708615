"""Ray: ingestion across encoder actors and sharded serving (optional extra `polyindex[ray]`)."""
