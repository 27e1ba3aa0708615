"""The dense kind: FAISS indexes, their filtered and stacked searches, a plain vector query's direct plan."""
