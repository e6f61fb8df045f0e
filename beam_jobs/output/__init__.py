"""Who owns the output and how it is committed: shard planning, fragments, shard commits, the output directory."""
