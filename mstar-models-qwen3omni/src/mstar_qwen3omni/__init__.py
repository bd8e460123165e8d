"""The ``qwen3omni`` model: the Qwen3-Omni-MoE Thinker as an M* plugin."""
