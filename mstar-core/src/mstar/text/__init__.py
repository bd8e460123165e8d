"""Text in and out for text-generating models: the checkpoint's tokenizer and chat
template (through ``transformers``), an exact incremental detokenizer, and the pieces a
text LLM plugin declares (``mstar.text.lm``)."""

from mstar.text.chat import chat_prompt_ids, template_messages
from mstar.text.detokenizer import IncrementalDetokenizer
from mstar.text.token_bytes import TokenRenderer
from mstar.text.tokenizer import load_tokenizer

__all__ = ["IncrementalDetokenizer", "TokenRenderer", "chat_prompt_ids", "load_tokenizer", "template_messages"]
