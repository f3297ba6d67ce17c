"""rlnorm's kernel where RL runs: in a transformers model (the trainer) and in a vLLM engine (the sampler).

- `rlnorm.integrations.transformers`: `apply_rlnorm(model)` swaps the gated norms of a model for rlnorm modules
  with the same weight and options, and can undo it.
- `rlnorm.integrations.vllm`: the general plugin that makes vLLM instantiate rlnorm's layer for its
  `RMSNormGated` (switched on by `RLNORM_VLLM=1`).
- `rlnorm.integrations.ops`: the kernel's forward as the opaque operator `torch.ops.rlnorm.rms_norm_gated`.
- `rlnorm.integrations.qwen3_next`: the norm as each side of RL builds it for a Qwen3-Next config.

Each module imports its framework when it is imported, never before: `import rlnorm.integrations` needs neither.
"""
