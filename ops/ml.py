"""ml operators."""
