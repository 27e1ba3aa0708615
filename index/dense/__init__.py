"""The dense kind: FAISS indexes, filtered and stacked searches, the vector lane's plan."""
