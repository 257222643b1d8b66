"""activation operators."""
