"""Layer 1, primitives: the target and its KV-cached session, sampling, the exact acceptance rule,
prompt sets, and the types a round passes around. Imports nothing else from dspark_core."""
