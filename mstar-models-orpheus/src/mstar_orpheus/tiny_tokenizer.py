"""A small byte-level tokenizer with the real Orpheus id layout, for tiny checkpoints.

Text becomes one token per UTF-8 byte (ids 0..255; no merges). Ids up to 127999 are
unused fillers so that Llama-3's special tokens land at their real ids (128000..128255,
``<|begin_of_text|>`` = 128000, ``<|eot_id|>`` = 128009) and Orpheus's
``<custom_token_N>`` at 128256 + N, exactly as in the released tokenizer.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

LLAMA_BASE_VOCAB = 128000
LLAMA_SPECIALS = 256
NAMED_SPECIALS = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "<|eot_id|>"}
BOS = "<|begin_of_text|>"


def llama_special_names() -> list[str]:
    names, reserved = [], 0
    for i in range(LLAMA_SPECIALS):
        if i in NAMED_SPECIALS:
            names.append(NAMED_SPECIALS[i])
        else:
            names.append(f"<|reserved_special_token_{reserved}|>")
            reserved += 1
    return names


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """``vocab_size`` is the model's (e.g. 156940): custom tokens fill 128256..vocab_size-1."""
    n_custom = vocab_size - LLAMA_BASE_VOCAB - LLAMA_SPECIALS
    if n_custom <= 0:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for Orpheus custom tokens (needs > 128256)")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab.update({f"<filler_{i}>": i for i in range(len(vocab), LLAMA_BASE_VOCAB)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in llama_special_names()])
    tok.add_tokens([AddedToken(f"<custom_token_{n}>", special=False, normalized=False) for n in range(n_custom)])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, LLAMA_BASE_VOCAB)]
    )
    return tok
