"""Storage: the manifest, immutable Arrow segments, snapshots, the segment writer and fsync helpers."""
