"""TODO: what this room owns and what it may import."""
