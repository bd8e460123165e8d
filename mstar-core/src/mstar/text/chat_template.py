"""The checkpoint's chat template, found where ``transformers`` finds it.

transformers 5.25 reads templates from different files depending on the class that loads
them (``tokenization_utils_base.from_pretrained`` and ``processing_utils.from_pretrained``):

- a tokenizer: ``chat_template.jinja`` (plus named ones in ``additional_chat_templates/*.jinja``), else
  ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{name, template}``);
- a processor: ``processor_config.json``'s ``chat_template``, else ``chat_template.json``
  (the legacy processor file), else ``chat_template.jinja`` (plus ``additional_chat_templates/``).

Releases ship one of these (a multimodal release: only ``chat_template.json``; files saved by
transformers 5: only ``chat_template.jinja``; older text LLMs: only ``tokenizer_config.json``),
so every text path must look in all of them. ``find_chat_template`` does, in the order of the
class the model's reference implementation uses (``prefer``), then in the other class's order
(as vLLM falls back from the tokenizer's template to the processor's). Where both classes
would find a template they pick the same file unless a checkpoint carries two different ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

JINJA_FILE = "chat_template.jinja"
JINJA_DIR = "additional_chat_templates"
PROCESSOR_TEMPLATE_FILE = "chat_template.json"
TEMPLATE_FILES = (JINJA_FILE, PROCESSOR_TEMPLATE_FILE, "processor_config.json", "tokenizer_config.json")

ChatTemplate = str | dict[str, str]
Preference = Literal["tokenizer", "processor"]


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _named(templates: dict[str, str]) -> ChatTemplate | None:
    """transformers' flattening: a lone ``default`` is the template itself."""
    if not templates:
        return None
    return templates["default"] if set(templates) == {"default"} else templates


def _jinja_files(root: Path) -> ChatTemplate | None:
    templates = {p.stem: p.read_text(encoding="utf-8") for p in sorted((root / JINJA_DIR).glob("*.jinja"))}
    if (root / JINJA_FILE).is_file():
        templates["default"] = (root / JINJA_FILE).read_text(encoding="utf-8")
    return _named(templates)


def _config_entry(value: Any) -> ChatTemplate | None:
    """A ``chat_template`` entry of a JSON config: a string or a list of ``{name, template}``."""
    if isinstance(value, list):
        return _named({t["name"]: t["template"] for t in value})
    return value or None


def tokenizer_chat_template(root: Path) -> ChatTemplate | None:
    """What ``AutoTokenizer.from_pretrained(root).chat_template`` holds."""
    return _jinja_files(root) or _config_entry(_json(root / "tokenizer_config.json").get("chat_template"))


def processor_chat_template(root: Path) -> ChatTemplate | None:
    """What ``AutoProcessor.from_pretrained(root).chat_template`` holds."""
    embedded = _config_entry(_json(root / "processor_config.json").get("chat_template"))
    if embedded is not None:
        return embedded
    legacy = _json(root / PROCESSOR_TEMPLATE_FILE).get("chat_template")
    return legacy if legacy is not None else _jinja_files(root)


def find_chat_template(checkpoint_dir: str | Path, prefer: Preference = "tokenizer") -> ChatTemplate | None:
    """The checkpoint's chat template (a string, or named templates), or None when it has
    none: as ``prefer``'s class loads it, else as the other class does."""
    root = Path(checkpoint_dir)
    first, second = (
        (tokenizer_chat_template, processor_chat_template)
        if prefer == "tokenizer"
        else (processor_chat_template, tokenizer_chat_template)
    )
    return first(root) or second(root)
