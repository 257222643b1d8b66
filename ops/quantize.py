"""quantize operators."""
