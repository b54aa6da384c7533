"""The certification stage: inputs, measuring, metrics, gates, verdict, hardware, certificate, keys,
verification, and the run that ties them together."""
