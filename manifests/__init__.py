"""Pinned data of the pipeline (pins, recipes, artifact sets, schemas, trusted keys) and its loader."""
