"""The multivector kind: late interaction over compressed per-token codes."""
