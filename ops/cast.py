"""cast operators."""
