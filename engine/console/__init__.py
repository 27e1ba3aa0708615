"""The web console: collections, search, explain, compare and evaluation in a browser."""
