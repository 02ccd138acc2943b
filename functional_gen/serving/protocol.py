"""The OpenAI request bodies as pydantic models (`extra="forbid"`: an unknown field is refused
with a 400 naming it).

Fields OpenAI documents and this server serves: `max_tokens` / `max_completion_tokens`,
`temperature`, `top_p`, `n`, `stop`, `seed`, `presence_penalty`, `frequency_penalty`,
`logit_bias`, `logprobs` / `top_logprobs`, `stream`, `stream_options.include_usage`,
`response_format`; vLLM's extras `min_p`, `repetition_penalty`, `top_k`, `stop_token_ids`, `guided_regex`,
`guided_grammar`, `guided_choice`, `guided_json`. Fields OpenAI documents as having no effect on
the output (`user`, `metadata`, `store`, `service_tier`, `parallel_tool_calls`) are accepted and
ignored; the others (tools, audio, `echo`, `best_of`, `suffix`, ...) are refused unless at
their default.

Source: OpenAI's API reference (Completions, Chat Completions), vLLM's `protocol.py`.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    """`stream_options`: `include_usage` adds a last chunk with the `usage` counts."""

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class JsonSchema(_Strict):
    """`response_format.json_schema`: a `name`, the `schema` (`schema_` here), `strict`."""

    name: str = "schema"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """`response_format`: `{"type": "text" | "json_object" | "json_schema", "json_schema": ...}`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class _Sampling(_Strict):
    """The fields both endpoints share."""

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extras
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    top_k: int | None = Field(default=None, ge=-1)
    stop_token_ids: list[int] | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: list[str] | None = None
    guided_json: dict[str, Any] | str | None = None
    # documented by OpenAI as not changing the output: accepted, ignored
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None


class CompletionRequest(_Sampling):
    """`POST /v1/completions`: `prompt` is text (or a list of one text, or token ids)."""

    prompt: str | list[str] | list[int]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatMessage(_Strict):
    """One message: `role` and `content` (text, or a list of `{"type": "text", "text": ...}`)."""

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]]
    name: str | None = None


class ChatCompletionRequest(_Sampling):
    """`POST /v1/chat/completions`: `messages` rendered with the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    parallel_tool_calls: bool | None = None
