"""The saved-voice library of one served model: each voice a safetensors file (the tensors
the adapter chose to keep) beside a small JSON file (name, model, created time, transcript).

Voices live under ``<voices_dir>/<model>-<fingerprint>/``, the fingerprint a hash of the
checkpoint's config: a voice made for one checkpoint is never offered to another (e.g. a
speaker embedding of another width), and a second server on the same directory and
checkpoint sees the same voices. The JSON file is created exclusively, so two servers saving
one name at once cannot both succeed; a voice without both files is not listed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mstar.api.errors import ApiError
from mstar.api.voices import SavedVoice

log = logging.getLogger("mstar.server")

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def default_voices_dir() -> Path:
    """``$MSTAR_VOICES_DIR``, else ``mstar/voices`` in the user's cache directory."""
    if os.environ.get("MSTAR_VOICES_DIR"):
        return Path(os.environ["MSTAR_VOICES_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "mstar" / "voices"


def config_fingerprint(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_name(name: str) -> None:
    """Names become file names: letters, digits, ``_ . -``, at most 64, no leading dot."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ApiError(
            400, f"name: {name!r} is not a valid voice name (1-64 characters of A-Z a-z 0-9 _ . -, starting with a letter or digit)",
            param="name", code="invalid_voice_name",
        )


@dataclass(frozen=True)
class VoiceEntry:
    """A saved voice as listed (its tensors stay on disk until a request uses it)."""

    name: str
    model: str
    created_at: float  # seconds since the epoch (listed as whole seconds)
    transcript: str | None
    sample_rate: int
    duration_s: float

    def describe(self, served_name: str) -> dict[str, Any]:
        return {
            "object": "voice", "id": self.name, "name": self.name, "model": served_name, "languages": [],
            "description": None, "default": False, "saved": True, "created_at": int(self.created_at),
            "has_transcript": self.transcript is not None, "reference_duration_s": round(self.duration_s, 3),
        }


class VoiceLibrary:
    def __init__(self, root: Path, model: str, config: dict[str, Any]) -> None:
        self.model = model
        self.dir = Path(root) / f"{model}-{config_fingerprint(config)}"
        self._lock = threading.Lock()

    def _paths(self, name: str) -> tuple[Path, Path]:
        check_name(name)
        return self.dir / f"{name}.json", self.dir / f"{name}.safetensors"

    def entries(self) -> list[VoiceEntry]:
        """Complete voices, oldest first."""
        if not self.dir.is_dir():
            return []
        out = []
        for meta_path in self.dir.glob("*.json"):
            entry = self._read_entry(meta_path.stem)
            if entry is not None:
                out.append(entry)
        return sorted(out, key=lambda e: (e.created_at, e.name))

    def get(self, name: str) -> VoiceEntry | None:
        return self._read_entry(name) if NAME_RE.fullmatch(name or "") else None

    def _read_entry(self, name: str) -> VoiceEntry | None:
        meta_path, tensor_path = self.dir / f"{name}.json", self.dir / f"{name}.safetensors"
        try:
            meta = json.loads(meta_path.read_text())
            if not tensor_path.is_file():
                return None
            return VoiceEntry(name, meta["model"], float(meta["created_at"]), meta.get("transcript"), int(meta["sample_rate"]), float(meta["duration_s"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # being written or deleted, or not ours

    def load(self, name: str) -> SavedVoice:
        from safetensors.torch import load_file

        entry = self.get(name)
        if entry is None:
            raise ApiError(404, f"no saved voice {name!r}", param="voice", code="voice_not_found")
        tensors = load_file(str(self.dir / f"{name}.safetensors"))
        return SavedVoice(name, tensors, entry.transcript)

    def save(self, name: str, tensors: dict[str, torch.Tensor], *, transcript: str | None, sample_rate: int, duration_s: float) -> VoiceEntry:
        """Store a new voice; 409 if the name is taken."""
        from safetensors.torch import save_file

        meta_path, tensor_path = self._paths(name)
        self.dir.mkdir(parents=True, exist_ok=True)
        entry = VoiceEntry(name, self.model, time.time(), transcript, sample_rate, duration_s)
        with self._lock:
            try:
                fd = os.open(meta_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                raise ApiError(409, f"a voice named {name!r} already exists; delete it first or pick another name", param="name", code="voice_exists") from None
            tmp = tensor_path.with_name(f".{name}.{os.getpid()}.tmp")
            try:
                save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp), metadata={"voice": name, "model": self.model})
                os.replace(tmp, tensor_path)
                meta = {"name": name, "model": self.model, "created_at": entry.created_at, "transcript": transcript,
                        "sample_rate": sample_rate, "duration_s": duration_s, "tensors": {k: list(v.shape) for k, v in tensors.items()}}
                os.write(fd, json.dumps(meta, indent=1).encode())
            except BaseException:
                os.close(fd)
                fd = -1
                for path in (tmp, tensor_path, meta_path):
                    path.unlink(missing_ok=True)
                raise
            finally:
                if fd >= 0:
                    os.close(fd)
        log.info("saved voice %r in %s", name, self.dir)
        return entry

    def delete(self, name: str) -> None:
        meta_path, tensor_path = self._paths(name)
        with self._lock:
            if self._read_entry(name) is None:
                raise ApiError(404, f"no saved voice {name!r}", param="name", code="voice_not_found")
            meta_path.unlink(missing_ok=True)  # first: the voice stops being listed at once
            tensor_path.unlink(missing_ok=True)
        log.info("deleted voice %r from %s", name, self.dir)


def saved_voice(rt: Any, endpoint: str, request: Any) -> SavedVoice | None:
    """The saved voice a speech request names (``voice``), or a chat request with audio out
    (``audio.voice``), or None (no voice, a built-in one, or a model that makes no voices:
    its adapter judges the name as before)."""
    library: VoiceLibrary | None = getattr(rt, "voices", None)
    name = requested_voice(endpoint, request)
    if library is None or not name or not rt.adapter.creates_voices:
        return None
    if name in {v.name for v in rt.adapter.voices()} or library.get(name) is None:
        return None
    return library.load(name)


def requested_voice(endpoint: str, request: Any) -> str | None:
    from mstar.api.adapter import CHAT, SPEECH

    if endpoint == SPEECH:
        return getattr(request, "voice", None)
    if endpoint == CHAT and getattr(request, "wants_audio", False) and request.audio is not None:
        return request.audio.voice_name
    return None
