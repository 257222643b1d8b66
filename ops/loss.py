"""loss operators."""
