"""A real, tiny byte-level BPE tokenizer with a ChatML chat template, for the tiny random
checkpoints tests and ``--random-weights`` write (no download: trained here, in
milliseconds, on a fixed corpus, so the same files come out every time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML as Qwen-style checkpoints write it: optional tools in the system turn, and
# `add_generation_prompt` opening the assistant turn.
CHATML_TEMPLATE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
    {{- '# Tools\n<tools>' }}
    {%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
    {{- '\n</tools><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'system' and loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}{{- message.content }}
        {%- else %}{%- for part in message.content %}{{- part.text }}{%- endfor %}{%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello world! How are you today?",
    "Serving composite multimodal models: text, audio, images and video.",
    "Ünïcödé façade naïve café — déjà vu. 你好，世界。 こんにちは 🙂🚀 ∑ x² ≤ ∞",
    "def main():\n    print('hello')\n    return 0\n",
    "system user assistant tools <tools> </tools>",
)


def train_byte_level_bpe(vocab_size: int = 384, corpus: tuple[str, ...] = CORPUS) -> Any:
    """A ``tokenizers.Tokenizer``: byte-level pre-tokenizer and decoder, the 256 byte
    symbols, merges up to ``vocab_size``, then the ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus) * 4, trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def write_tiny_tokenizer(checkpoint_dir: str | Path, vocab_size: int = 384) -> Any:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` (with the chat template) into
    ``checkpoint_dir``; returns the ``transformers`` tokenizer. EOS is ``<|im_end|>``."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=train_byte_level_bpe(vocab_size),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHATML_TEMPLATE
    hf.save_pretrained(str(checkpoint_dir))
    return hf
