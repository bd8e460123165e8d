"""Per-request sampling parameters (validated at the API boundary)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mstar.sampling.seeds import MAX_SEED

MAX_TOP_LOGPROBS = 20


class SamplingParams(BaseModel):
    """Sampling parameters of one sampler (main or auxiliary) of one request.

    Semantics follow vLLM/OpenAI: ``temperature=0`` is greedy; ``top_k`` of 0 or -1
    disables it; repetition_penalty uses HF semantics over prompt+output tokens;
    presence/frequency penalties use OpenAI semantics over output tokens only.
    ``stop`` strings are stored here but applied by the text layer.
    """

    # extra="forbid" turns a misspelled field into an error that names it.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    temperature: float = Field(1.0, ge=0.0)
    top_k: int = -1
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    max_tokens: int = Field(16, ge=1)
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: tuple[Annotated[int, Field(ge=0)], ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator(
        "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
        "frequency_penalty", "seed", "max_tokens", "min_tokens", "top_logprobs",
        mode="before",
    )
    @classmethod
    def _reject_bool(cls, v: Any) -> Any:
        # Pydantic's lax mode would read True as 1; for a number that is a client bug.
        if isinstance(v, bool):
            raise ValueError("expected a number, got a boolean")
        return v

    @field_validator("top_k")
    @classmethod
    def _check_top_k(cls, v: int) -> int:
        if v < -1:
            raise ValueError("top_k must be 0 or -1 (disabled) or >= 1")
        return v

    @field_validator("stop", mode="before")
    @classmethod
    def _single_stop_string(cls, v: Any) -> Any:
        # OpenAI accepts a bare string for `stop`.
        return (v,) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _check_cross_fields(self) -> SamplingParams:
        if self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})"
            )
        if self.top_logprobs > 0 and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=True")
        return self

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @property
    def uses_top_k_or_p(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0

    def override(self, update: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
        """Validated copy with ``update`` applied on top of this one.

        A ``SamplingParams`` update contributes only the fields it set explicitly,
        so plugin defaults survive for everything a request left out. The result
        remembers which fields were set (ours plus the update's), so merging is
        idempotent. Unlike ``model_copy(update=...)`` this re-runs validation.
        """
        if update is None:
            return self
        if isinstance(update, SamplingParams):
            update = update.model_dump(include=update.model_fields_set)
        merged = {**self.model_dump(include=self.model_fields_set), **update}
        return SamplingParams.model_validate(merged)

    def min_tokens_stop_ids(self, eos_ids: Iterable[int]) -> list[int]:
        """Ids to suppress while fewer than ``min_tokens`` were generated.

        EOS only counts as a stop when ``ignore_eos`` is off (vLLM semantics).
        """
        ids = set(self.stop_token_ids)
        if not self.ignore_eos:
            ids.update(eos_ids)
        return sorted(ids)
