"""index operators."""
