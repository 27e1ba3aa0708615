"""Online writes: the write-ahead log and the in-memory buffer that is sealed into segments."""
