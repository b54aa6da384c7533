"""worker stage."""
