"""What a model plugin declares and implements: its spec, its submodules, its policies."""
