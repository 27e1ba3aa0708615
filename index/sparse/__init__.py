"""The sparse kind: ultra-high-dimensional sparse vectors from a trained projector."""
