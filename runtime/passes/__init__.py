"""Graph passes (shape/type inference, folding, fusion, autodiff)."""
