"""Request kwargs of Base (voice clone) requests: the adapter sets them, the graph's walk
choice (``plugin.CloneWalks``) reads them."""

from __future__ import annotations

# Kwarg of a request carrying its clip's features (``ref_mel``, ``ref_wave``): which encoder
# walks run before the prefill (``X_VECTOR_ONLY``: the speaker's x-vector; ``IN_CONTEXT``:
# also the clip's codes).
CLONE_ENCODE, X_VECTOR_ONLY, IN_CONTEXT = "clone_encode", "x_vector_only", "in_context"
# Kwarg: run only the encoder walks (making a voice: the outputs go to the client).
ENCODE_ONLY = "encode_only"
