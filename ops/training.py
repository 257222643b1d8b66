"""training operators."""
