"""Ingestion: streaming document sources, bulk indexing and progress reporting."""
