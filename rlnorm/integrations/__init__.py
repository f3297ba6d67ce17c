"""rlnorm's kernel where RL runs: `transformers` (`apply_rlnorm`, the trainer), `vllm` (the plugin, the sampler),
`ops` (the opaque operator) and `qwen3_next` (the norm as each side builds it). Each imports its framework only when
imported itself.
"""
