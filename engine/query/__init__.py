"""The query pipeline: rank profiles, metadata filters, retrieve, fuse, rerank and hits."""
