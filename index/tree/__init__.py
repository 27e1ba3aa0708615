"""The tree kind: a hierarchical prototype tree searched coarse to fine."""
