"""Real tokenizers of the families text LLMs use, built with the `tokenizers` library."""

from __future__ import annotations

from typing import Any

from mstar.text.tiny_tokenizer import CORPUS, SPECIAL_TOKENS, train_byte_level_bpe

ADDED = "<think>"  # an added token that is not special: decode always shows it


def _wrap(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", clean_up_tokenization_spaces=False)
    hf.add_tokens([ADDED])
    return hf


def byte_level_bpe() -> Any:
    return _wrap(train_byte_level_bpe())


def sentencepiece_bpe() -> Any:
    """SentencePiece-style BPE: Metaspace pre-tokenizer and decoder (``▁`` for spaces)."""
    from tokenizers import SentencePieceBPETokenizer

    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator(list(CORPUS) * 4, vocab_size=300, special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    return _wrap(sp._tokenizer)


def sentencepiece_unigram() -> Any:
    from tokenizers import SentencePieceUnigramTokenizer

    sp = SentencePieceUnigramTokenizer()
    sp.train_from_iterator(list(CORPUS) * 4, vocab_size=200, special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    return _wrap(sp._tokenizer)


def byte_fallback_bpe() -> Any:
    """Llama-2-style: SentencePiece BPE with ``<0xNN>`` byte tokens for unknown characters,
    decoded by Replace(▁→space), ByteFallback, Fuse, Strip(one leading space)."""
    from tokenizers import SentencePieceBPETokenizer, Tokenizer, decoders, models, normalizers

    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator([c for c in CORPUS if c.isascii()] * 4, vocab_size=150, show_progress=False)
    vocab = dict(sp.get_vocab())
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m) for m in __import__("json").loads(sp._tokenizer.to_str())["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return _wrap(tok)


ALL = {
    "byte_level_bpe": byte_level_bpe,
    "sentencepiece_bpe": sentencepiece_bpe,
    "sentencepiece_unigram": sentencepiece_unigram,
    "byte_fallback_bpe": byte_fallback_bpe,
}
