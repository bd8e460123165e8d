"""A small byte-level BPE tokenizer with the released Qwen3-Omni special tokens at their real
ids (``<|im_start|>`` = 151644, ``<|image_pad|>`` = 151655, ``<|audio_pad|>`` = 151675, ...),
optionally the chat roles as the single tokens the released vocabulary has (``user`` = 872,
``assistant`` = 77091, ``system`` = 8948: the Talker finds the assistant turn by them), and a
chat template, written into tiny test checkpoints (the real ones ship Qwen's own)."""

from __future__ import annotations

import json
from pathlib import Path

FIRST_SPECIAL_ID = 151643
# The released tokenizer's added tokens from id 151643 on, in id order.
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
# Role words at their released ids (config.json's user_token_id, assistant_token_id, ...).
ROLE_TOKENS = {"system": 8948, "user": 872, "assistant": 77091}

# Media parts become one placeholder each; the processor expands them to the media's length.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- elif part['type'] in ['image', 'image_url'] %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] in ['audio', 'input_audio', 'audio_url'] %}{{- '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{%- elif part['type'] in ['video', 'video_url'] %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_CORPUS = (
    "Hello! How are you today? I am fine, thank you. What is in this picture? A cat sits on a mat. "
    "Describe the audio clip. Someone is speaking about the weather; it will rain tomorrow. "
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 10 100 2024. "
    "You are a helpful assistant. Please answer briefly and clearly, in English or in other languages: "
    "bonjour, hola, guten Tag, ciao, 你好, こんにちは."
)


def build_tokenizer_json(merges_vocab: int = 600, role_tokens: bool = False) -> str:
    """tokenizer.json text: BPE trained on a small corpus, the vocabulary padded with
    unreachable fillers up to 151643, then the special tokens; with ``role_tokens`` the role
    words at their released ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=merges_vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    for i in range(len(vocab), FIRST_SPECIAL_ID):
        vocab[f"<|filler_{i}|>"] = i  # no merge produces these: never emitted
    roles = ROLE_TOKENS if role_tokens else {}
    for word, i in roles.items():
        assert word not in vocab, word
        vocab[word] = i
        del vocab[f"<|filler_{i}|>"]
    tok = Tokenizer.from_str(json.dumps(spec))
    # Added tokens already in the vocabulary keep its ids: each role word is one token.
    tok.add_tokens([AddedToken(word, special=False, normalized=False) for word in roles])
    tok.add_special_tokens([AddedToken(t, special=t not in NOT_SPECIAL, normalized=False) for t in SPECIAL_TOKENS])
    assert tok.token_to_id("<|audio_pad|>") == FIRST_SPECIAL_ID + len(SPECIAL_TOKENS) - 1
    assert all(tok.token_to_id(word) == i for word, i in roles.items())
    return tok.to_str()


def write_tokenizer(path: Path, role_tokens: bool = False) -> None:
    """``role_tokens``: as the released vocabulary, which the Talker's prompt rule needs (the
    processor fixtures were made without them)."""
    path = Path(path)
    (path / "tokenizer.json").write_text(build_tokenizer_json(role_tokens=role_tokens))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 65536,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        # Names the Qwen3-Omni processor reads from its tokenizer.
        "extra_special_tokens": {
            "image_token": "<|image_pad|>",
            "audio_token": "<|audio_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
        },
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
