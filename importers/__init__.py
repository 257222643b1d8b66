"""Importers: translate other formats into the Graph IR."""
