"""A thin httpx client for ``mstar serve``.

    from mstar.client import Client

    with Client("http://127.0.0.1:8000") as c:
        print(c.chat([{"role": "user", "content": "Hi"}])["choices"][0]["message"]["content"])
        for delta in c.chat_stream([{"role": "user", "content": "Hi"}]):
            print(delta, end="")
        wav = c.speech("Hello there")
        c.create_voice("anna", "anna.wav", transcript="Hello, I am Anna.")  # a model that clones
        wav = c.speech("Hello there", voice="anna")
        out = c.generate({"prompt_ids": [256, 72, 105]}, sampling={"max_tokens": 8})
        out.outputs["token"]  # a torch.Tensor
        text = c.transcribe("speech.wav", language="en")["text"]  # a model that transcribes
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


class MstarAPIError(Exception):
    """An error answer of the server (OpenAI's error shape), or an error event mid-stream."""

    def __init__(self, status: int, error: Mapping[str, Any]) -> None:
        self.status = status
        self.message = str(error.get("message", "unknown error"))
        self.type = error.get("type")
        self.param = error.get("param")
        self.code = error.get("code")
        super().__init__(f"{status} {self.type}: {self.message}" + (f" (param {self.param})" if self.param else ""))


@dataclass
class GenerateResult:
    id: str
    outputs: dict[str, Any]  # signal -> torch.Tensor
    finish_reason: str | None
    seeds: dict[str, int] = field(default_factory=dict)


class Client:
    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None, timeout: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/").removesuffix("/v1"), headers=headers, timeout=timeout)
        self._model: str | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- service ---------------------------------------------------------------------
    def models(self) -> list[str]:
        return [m["id"] for m in self._get("/v1/models")["data"]]

    def health(self) -> dict[str, Any]:
        r = self._http.get("/health")
        return {"healthy": r.status_code == 200, **r.json()}

    @property
    def model(self) -> str:
        """The served model (one server serves one model)."""
        if self._model is None:
            self._model = self.models()[0]
        return self._model

    # ---- chat --------------------------------------------------------------------------
    def chat(self, messages: list[dict[str, Any]], model: str | None = None, **params: Any) -> dict[str, Any]:
        """A whole chat completion (OpenAI's response body as a dict)."""
        return self._post_json("/v1/chat/completions", {"model": model or self.model, "messages": messages, **params})

    def chat_chunks(self, messages: list[dict[str, Any]], model: str | None = None, **params: Any) -> Iterator[dict[str, Any]]:
        """Every SSE chunk of a streamed chat completion."""
        body = {"model": model or self.model, "messages": messages, **params, "stream": True}
        yield from self._sse("/v1/chat/completions", body)

    def chat_stream(self, messages: list[dict[str, Any]], model: str | None = None, **params: Any) -> Iterator[str]:
        """Only the text deltas of a streamed chat completion."""
        for chunk in self.chat_chunks(messages, model, **params):
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content")
                if text:
                    yield text

    # ---- speech ------------------------------------------------------------------------
    def speech(self, text: str, model: str | None = None, response_format: str = "wav", **params: Any) -> bytes:
        """The whole audio file (wav, flac) or raw 16-bit PCM (pcm)."""
        r = self._http.post("/v1/audio/speech", json={"model": model or self.model, "input": text, "response_format": response_format, **params})
        _raise_for(r)
        return r.content

    def speech_stream(self, text: str, model: str | None = None, response_format: str = "pcm", **params: Any) -> Iterator[bytes]:
        """Audio bytes as they are generated (``stream_format: "audio"``)."""
        body = {"model": model or self.model, "input": text, "response_format": response_format, "stream_format": "audio", **params}
        with self._http.stream("POST", "/v1/audio/speech", json=body) as r:
            if r.status_code >= 400:
                r.read()
                _raise_for(r)
            yield from r.iter_bytes()

    # ---- voices ------------------------------------------------------------------------------
    def voices(self, model: str | None = None) -> list[dict[str, Any]]:
        """Built-in and saved voices (of ``model``; default: of every served model)."""
        return self._get("/v1/audio/voices" + (f"?model={model}" if model else ""))["data"]

    def create_voice(self, name: str, audio: bytes | str | Path, transcript: str | None = None, model: str | None = None,
                     **options: Any) -> dict[str, Any]:
        """Save a voice made from a reference clip (its bytes, or a file path); ``options``
        are the model's (e.g. ``x_vector_only_mode``)."""
        data = audio if isinstance(audio, bytes) else Path(audio).read_bytes()
        fields = {"name": name, **({"transcript": transcript} if transcript else {}), **({"model": model} if model else {}),
                  **{k: json.dumps(v) if isinstance(v, bool) else str(v) for k, v in options.items()}}
        r = self._http.post("/v1/audio/voices", data=fields, files={"audio": ("reference", data)})
        _raise_for(r)
        return r.json()

    # ---- speech to text -------------------------------------------------------------------
    def transcribe(self, audio: bytes | str | Path, model: str | None = None, *, translate: bool = False,
                   response_format: str = "json", **fields: Any) -> Any:
        """``POST /v1/audio/transcriptions`` (``translations`` with ``translate``) of a file's
        bytes or path: the JSON body as a dict (``json``, ``verbose_json``) or the text
        (``text``, ``srt``, ``vtt``); ``fields`` are the other form fields (``language``,
        ``prompt``, ``temperature``, ``max_tokens``, ...)."""
        data = audio if isinstance(audio, bytes) else Path(audio).read_bytes()
        form = {"model": model or self.model, "response_format": response_format, **{k: str(v) for k, v in fields.items()}}
        path = "/v1/audio/translations" if translate else "/v1/audio/transcriptions"
        r = self._http.post(path, data=form, files={"file": ("audio", data)})
        _raise_for(r)
        return r.json() if response_format in ("json", "verbose_json") else r.text

    def transcribe_stream(self, audio: bytes | str | Path, model: str | None = None, **fields: Any) -> Iterator[str]:
        """The text deltas of a streamed transcription (``transcript.text.delta`` events)."""
        data = audio if isinstance(audio, bytes) else Path(audio).read_bytes()
        form = {"model": model or self.model, "stream": "true", **{k: str(v) for k, v in fields.items()}}
        with self._http.stream("POST", "/v1/audio/transcriptions", data=form, files={"file": ("audio", data)}) as r:
            if r.status_code >= 400:
                r.read()
                _raise_for(r)
            for line in r.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise MstarAPIError(500, event["error"])
                    if event.get("type") == "transcript.text.delta":
                        yield event["delta"]

    def delete_voice(self, name: str, model: str | None = None) -> None:
        r = self._http.delete(f"/v1/audio/voices/{name}", params={"model": model} if model else None)
        _raise_for(r)

    # ---- native generate ------------------------------------------------------------------
    def generate(self, inputs: Mapping[str, Any], model: str | None = None, *, sampling: Mapping[str, Any] | None = None,
                 signals: list[str] | None = None, kwargs: Mapping[str, Any] | None = None) -> GenerateResult:
        from mstar.api.tensors import tensor_from_json

        out = self._post_json("/v1/generate", self._generate_body(inputs, model, sampling, signals, kwargs))
        return GenerateResult(
            out["id"], {k: tensor_from_json(v, k) for k, v in out["outputs"].items()}, out["finish_reason"], out.get("seeds", {})
        )

    def generate_stream(self, inputs: Mapping[str, Any], model: str | None = None, *, sampling: Mapping[str, Any] | None = None,
                        signals: list[str] | None = None, kwargs: Mapping[str, Any] | None = None) -> Iterator[tuple[str, Any]]:
        """``(signal, tensor)`` pairs as the engine produces them."""
        from mstar.api.tensors import tensor_from_json

        body = {**self._generate_body(inputs, model, sampling, signals, kwargs), "stream": True}
        with self._http.stream("POST", "/v1/generate", json=body) as r:
            if r.status_code >= 400:
                r.read()
                _raise_for(r)
            for line in r.iter_lines():
                if not line:
                    continue
                event = json.loads(line)
                if "error" in event:
                    raise MstarAPIError(500, event["error"])
                if event.get("finished"):
                    return
                yield event["signal"], tensor_from_json(event["tensor"], event["signal"])

    def _generate_body(self, inputs: Mapping[str, Any], model: str | None, sampling: Mapping[str, Any] | None,
                       signals: list[str] | None, kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
        from mstar.api.tensors import tensor_to_json

        encoded = {k: tensor_to_json(v) if hasattr(v, "dtype") and hasattr(v, "shape") and hasattr(v, "numpy") else _plain(v) for k, v in inputs.items()}
        body: dict[str, Any] = {"model": model or self.model, "inputs": encoded, "kwargs": dict(kwargs or {})}
        if sampling is not None:
            body["sampling"] = dict(sampling)
        if signals is not None:
            body["signals"] = signals
        return body

    # ---- transport -------------------------------------------------------------------------
    def _get(self, path: str) -> Any:
        r = self._http.get(path)
        _raise_for(r)
        return r.json()

    def _post_json(self, path: str, body: dict[str, Any]) -> Any:
        r = self._http.post(path, json=body)
        _raise_for(r)
        return r.json()

    def _sse(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        with self._http.stream("POST", path, json=body) as r:
            if r.status_code >= 400:
                r.read()
                _raise_for(r)
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event and "choices" not in event:
                    raise MstarAPIError(500, event["error"])
                yield event


def _plain(value: Any) -> Any:
    """numpy arrays become nested lists; other values pass as they are."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else value


def _raise_for(r: httpx.Response) -> None:
    if r.status_code < 400:
        return
    try:
        error = r.json()["error"]
    except Exception:
        error = {"message": r.text or r.reason_phrase}
    raise MstarAPIError(r.status_code, error)
