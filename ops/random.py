"""random operators."""
