"""patches stage."""
