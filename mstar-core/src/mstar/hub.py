"""Checkpoints named by a Hugging Face repo id (``org/name``), through ``huggingface_hub``.

Everything ``huggingface_hub`` honours applies: its cache (``HF_HOME``, ``HF_HUB_CACHE``),
offline mode (``HF_HUB_OFFLINE=1``: the cache only), tokens (``HF_TOKEN``) and a
``revision`` (branch, tag or commit). Online, missing files are downloaded with its
progress bars. ``huggingface_hub`` is imported only when a repo id is actually resolved.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mstar.plugins.errors import PluginError

# Hub repo ids: "name" or "org/name" of letters, digits, '-', '_', '.'; we require the org,
# so that a plain word stays a model name (or a typo of one), never a download.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*")

# Other frameworks' copies of the weights: never read by a plugin, often as large as the model.
IGNORE_PATTERNS = ["*.h5", "*.msgpack", "*.onnx", "*.ot", "*.tflite", "flax_model*", "tf_model*", "rust_model*"]


class HubError(PluginError, ValueError):
    """A repo id that cannot be resolved (one line, says what to do)."""


def is_repo_id(target: str | Path) -> bool:
    """``org/name`` that is not an existing path."""
    text = str(target)
    return bool(_REPO_ID.fullmatch(text)) and not text.endswith(".") and not Path(text).exists()


def checkpoint_dir(target: str | Path, revision: str | None = None) -> Path:
    """The directory of ``target``: itself when it is a directory, else the snapshot of the
    repo id ``target`` at ``revision`` in the Hub cache (downloaded when online)."""
    path = Path(target).expanduser()
    if path.is_dir():
        if revision is not None:
            raise HubError(f"--revision {revision!r} applies to Hub repo ids, not to the directory {path}")
        return path
    if not is_repo_id(target):
        raise HubError(f"{target}: no such directory, and not a Hugging Face repo id (org/name)")
    from huggingface_hub import snapshot_download

    with _hub_errors(str(target), revision):
        return Path(snapshot_download(str(target), revision=revision, ignore_patterns=IGNORE_PATTERNS))


def repo_config(repo_id: str, revision: str | None = None) -> dict[str, Any]:
    """``config.json`` of a Hub repo (that file only: enough to pick the plugin)."""
    from huggingface_hub import hf_hub_download

    with _hub_errors(repo_id, revision):
        path = Path(hf_hub_download(repo_id, "config.json", revision=revision))
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise HubError(f"cannot read config.json of {repo_id}: {exc}") from None
    if not isinstance(config, dict):
        raise HubError(f"config.json of {repo_id} is not a JSON object")
    return config


class _hub_errors:
    """Turns ``huggingface_hub``'s exceptions into one-line ``HubError``s."""

    def __init__(self, repo_id: str, revision: str | None) -> None:
        self.where = f"{repo_id}" + (f" at revision {revision!r}" if revision else "")

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None:
            return False
        from huggingface_hub import constants
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        if isinstance(exc, LocalEntryNotFoundError):
            why = (
                "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub cannot be reached"
            )
            raise HubError(
                f"{self.where} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}; "
                "download it once online, or pass a checkpoint directory"
            ) from None
        if isinstance(exc, GatedRepoError):
            raise HubError(f"{self.where} is gated: accept its terms on huggingface.co and set HF_TOKEN") from None
        if isinstance(exc, RevisionNotFoundError):
            raise HubError(f"{self.where}: no such revision on the Hub") from None
        if isinstance(exc, RepositoryNotFoundError):
            raise HubError(f"{self.where}: no such repo on the Hub (or it is private: set HF_TOKEN)") from None
        if isinstance(exc, EntryNotFoundError):
            raise HubError(f"{self.where} has no config.json, so its model cannot be recognised; name the model instead") from None
        if isinstance(exc, HFValidationError):
            raise HubError(f"{self.where}: {exc}") from None
        return False
