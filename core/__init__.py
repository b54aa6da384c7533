"""The kernel every stage shares: errors and exit codes, JSON I/O and canonical digests, hashing,
subprocess running, the one lock helper, filesystem guards, the workspace and the run context.

It imports nothing of the project and only the standard library (plus blake3, and platformdirs for
the user data and cache folders), so any stage may use it
and it can never be the reason for an import cycle (the import contracts in pyproject.toml hold it)."""
