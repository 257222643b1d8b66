"""image operators."""
