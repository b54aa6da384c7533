"""lanes stage."""
