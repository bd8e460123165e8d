"""M*: serving composite multimodal models."""
