"""Encoders: text to sentence embeddings and to per-token embeddings (sentence-transformers)."""
