"""The staged-pipeline runtime: driving shard workers stage by stage (local or attached), the chained
sink, worker identity checks, the network fabrics and the userspace shaper, and the link/physics model.

It sits between ``worker`` (one worker's process and client) and ``certify`` (what the runs mean): it
runs placements and reports what happened; deciding PASS or FAIL is certify's."""
