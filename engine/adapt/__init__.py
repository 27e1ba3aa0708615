"""Adapting a collection's encoder to its own corpus (``polyindex adapt``): learning it, and the durable run."""
