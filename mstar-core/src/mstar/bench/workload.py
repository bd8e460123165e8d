"""Benchmark requests: random prompts, or prompts read from a JSONL file.

The client does not know the model's tokenizer, so random prompts are counted in words;
the prompt token counts in the results are the ones the server reports.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from mstar.bench.records import BenchRequest, Workload

# Plain, short English words: every tokenizer splits them into few tokens.
_WORD_LIST = (
    "the of and to in is it you that was for on are with as his they be at one have this from "
    "or had by word but what some we can out other were all there when up use your how said an "
    "each she which do their time if will way about many then them write would like so these her "
    "long make thing see him two has look more day could go come did number sound no most people "
    "my over know water than call first who may down side been now find any new work part take "
    "get place made live where after back little only round man year came show every good me give "
    "our under name very through just form sentence great think say help low line differ turn cause"
)
WORDS = tuple(_WORD_LIST.split())


def random_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, words))).capitalize() + "."


def random_requests(
    workload: Workload, num: int, input_words: int, max_tokens: int | None, seed: int = 0, **fields: Any
) -> list[BenchRequest]:
    """``num`` requests with random prompts of ``input_words`` words (seeded: the same
    ``seed`` gives the same prompts), each asking for at most ``max_tokens`` tokens."""
    rng = random.Random(seed)
    return [_request(workload, random_text(rng, input_words), max_tokens, fields) for _ in range(num)]


def jsonl_requests(
    workload: Workload, path: str | Path, num: int | None, max_tokens: int | None, **fields: Any
) -> list[BenchRequest]:
    """Requests from a JSONL file, one object a line: ``{"prompt": str}`` (or ``"input"``
    for speech, or ``"messages"`` for chat), optionally with ``"max_tokens"`` and any other
    request field (e.g. ``"voice"``), which win over the command line's. Blank lines are
    skipped; with ``num`` set the file is cycled or cut to ``num`` requests."""
    rows: list[dict[str, Any]] = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no requests in the file")
    count = len(rows) if num is None else num
    out = []
    for i in range(count):
        row = dict(rows[i % len(rows)])
        text = row.pop("prompt", None)
        if workload == "speech":
            text = row.pop("input", text)
        if text is None and not (workload == "chat" and "messages" in row):
            key = "'input' or 'prompt'" if workload == "speech" else "'prompt' or 'messages'"
            raise ValueError(f"{path}: request {i % len(rows) + 1} has no {key}")
        out.append(_request(workload, text, row.pop("max_tokens", max_tokens), {**fields, **row}))
    return out


def _request(workload: Workload, text: str | None, max_tokens: int | None, fields: dict[str, Any]) -> BenchRequest:
    body: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    if workload == "chat":
        if text is not None:
            body["messages"] = [{"role": "user", "content": text}]
    else:
        body["input"] = text
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return BenchRequest(workload, body)
