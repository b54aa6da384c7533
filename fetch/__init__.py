"""fetch stage."""
