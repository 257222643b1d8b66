"""control operators."""
