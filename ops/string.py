"""string operators."""
