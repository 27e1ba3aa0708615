"""Adapting a collection's encoder to its own corpus without labels (synthetic queries, a teacher, a fine-tuned student) and the durable run."""
