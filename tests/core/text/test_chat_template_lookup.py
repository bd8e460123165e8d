"""One chat-template lookup for every text path (``mstar.text.chat_template``), against what
transformers 5.25 itself loads from the same files: ``AutoTokenizer``'s template and the
processor's (``ProcessorMixin.get_processor_dict``); the tokenizer loads from ``vocab.json`` +
``merges.txt`` without ``tokenizer.json``; a chat formats as transformers formats it in every
layout (the release layouts of ``mstar.testing.release_layouts``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mstar.testing.release_layouts import variant_copy
from mstar.text import chat_prompt_ids, load_tokenizer
from mstar.text.chat_template import find_chat_template
from mstar.text.tiny_tokenizer import write_tiny_tokenizer

transformers = pytest.importorskip("transformers")

OTHER = "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
TOOLS = "{{- 'tools: ' + (tools | length | string) }}"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello 你好!"}]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer as written (``chat_template.jinja``), its class one that builds from
    ``vocab.json`` + ``merges.txt`` as Qwen releases name it."""
    root = tmp_path_factory.mktemp("written")
    write_tiny_tokenizer(root)
    config = json.loads((root / "tokenizer_config.json").read_text())
    (root / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "Qwen2Tokenizer"}))
    return root


def tokenizer_reference(root: Path):
    return transformers.AutoTokenizer.from_pretrained(str(root)).chat_template


def processor_reference(root: Path):
    return transformers.ProcessorMixin.get_processor_dict(str(root))[0].get("chat_template")


LAYOUTS = {
    "jinja": ("template_in_chat_template_jinja",),
    "json": ("template_in_chat_template_json",),
    "tokenizer_config": ("template_in_tokenizer_config",),
    "slow_files_json": ("template_in_chat_template_json", "slow_tokenizer_files"),
    "slow_files_tokenizer_config": ("template_in_tokenizer_config", "slow_tokenizer_files"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_formats_the_chat_as_transformers(written, tmp_path, layout) -> None:
    root = variant_copy(written, tmp_path / layout, *LAYOUTS[layout])
    want = tokenizer_reference(root) or processor_reference(root)  # the one file that holds it
    assert want is not None
    assert find_chat_template(root) == find_chat_template(root, "processor") == want
    ours = load_tokenizer(root)
    reference = transformers.AutoTokenizer.from_pretrained(str(root))
    want_ids = reference.apply_chat_template(MESSAGES, chat_template=want, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert chat_prompt_ids(ours, MESSAGES) == want_ids
    assert ours.decode(want_ids).startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_slow_tokenizer_files_load_without_tokenizer_json(written, tmp_path) -> None:
    root = variant_copy(written, tmp_path / "slow", "slow_tokenizer_files")
    assert not (root / "tokenizer.json").exists() and (root / "vocab.json").is_file() and (root / "merges.txt").is_file()
    fast = transformers.AutoTokenizer.from_pretrained(str(written))
    slow = load_tokenizer(root)
    text = "Hello world! naïve café<|im_end|>\n<|im_start|>assistant"
    assert slow.encode(text) == fast.encode(text)
    assert (slow.eos_token, slow.eos_token_id) == (fast.eos_token, fast.eos_token_id) == ("<|im_end|>", 383)


def _files(root: Path, **files: object) -> Path:
    root.mkdir()
    write_tiny_tokenizer(root)
    (root / "chat_template.jinja").unlink()
    for name, content in files.items():
        path = root / name.replace("__", "/").replace("_dot_", ".")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return root


def test_where_the_two_classes_disagree_each_preference_follows_its_class(tmp_path) -> None:
    """A checkpoint with a different template in chat_template.jinja and chat_template.json:
    the tokenizer reads the .jinja, the processor the .json."""
    root = _files(tmp_path / "both", chat_template_dot_jinja=OTHER, chat_template_dot_json={"chat_template": TOOLS})
    assert find_chat_template(root, "tokenizer") == tokenizer_reference(root) == OTHER
    assert find_chat_template(root, "processor") == processor_reference(root) == TOOLS
    # processor_config.json's own entry wins for the processor (deprecated, still read)
    root = _files(tmp_path / "embedded", chat_template_dot_json={"chat_template": OTHER},
                  processor_config_dot_json={"chat_template": TOOLS})
    assert find_chat_template(root, "processor") == processor_reference(root) == TOOLS
    assert find_chat_template(root, "tokenizer") == TOOLS  # the tokenizer has none: the processor's


def test_named_templates_load_as_transformers_names_them(tmp_path) -> None:
    root = _files(tmp_path / "dir", chat_template_dot_jinja=OTHER, additional_chat_templates__tool_use_dot_jinja=TOOLS)
    assert find_chat_template(root) == tokenizer_reference(root) == {"default": OTHER, "tool_use": TOOLS}
    assert find_chat_template(root, "processor") == processor_reference(root)
    tok = load_tokenizer(root)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert tok.decode(chat_prompt_ids(tok, MESSAGES, tools=tools)) == "tools: 1"  # the tool_use one
    listed = _files(tmp_path / "list", tokenizer_config_dot_json={
        **json.loads((root / "tokenizer_config.json").read_text()),
        "chat_template": [{"name": "default", "template": OTHER}, {"name": "tool_use", "template": TOOLS}],
    })
    assert find_chat_template(listed) == tokenizer_reference(listed) == {"default": OTHER, "tool_use": TOOLS}


def test_no_template_anywhere_is_an_error_naming_the_files(written, tmp_path) -> None:
    root = variant_copy(written, tmp_path / "none", "without_chat_template")
    assert find_chat_template(root) is None and tokenizer_reference(root) is None and processor_reference(root) is None
    with pytest.raises(ValueError, match=r"no chat template \(none in chat_template.jinja, chat_template.json, "
                                         r"processor_config.json, tokenizer_config.json\); use /v1/completions"):
        chat_prompt_ids(load_tokenizer(root), MESSAGES)
