"""Real model adapters: one class per wire protocol, each over the vendor's official SDK.

``AgentLoop(OpenAIChat("gpt-6.2-sol"))`` just works. The SDKs are optional extras
(``pip install 'kerman[openai]'``, ``kerman[anthropic]``, ``kerman[gemini]``), imported when a
provider is constructed, never by ``import kerman`` or ``import kerman.providers``.
docs/providers.md has the guide.
"""

from __future__ import annotations

from ..errors import (
    AuthenticationError,
    ContextLengthError,
    InvalidRequestError,
    ModelConnectionError,
    ModelTimeoutError,
    OverloadedError,
    RateLimitError,
    ServerError,
)
from ._base import Provider, ReplyBuilder, classify, usage_chunk
from .anthropic import Anthropic
from .gemini import Gemini
from .openai_chat import OpenAIChat
from .openai_responses import OpenAIResponses
from .retry import FALLBACK_ON, RETRY_ON, Fallback, retry_policy, should_retry

__all__ = [
    "OpenAIChat",
    "OpenAIResponses",
    "Anthropic",
    "Gemini",
    "Fallback",
    "retry_policy",
    "should_retry",
    "RETRY_ON",
    "FALLBACK_ON",
    "Provider",
    "ReplyBuilder",
    "usage_chunk",
    "classify",
    "RateLimitError",
    "ServerError",
    "OverloadedError",
    "ModelTimeoutError",
    "ModelConnectionError",
    "ContextLengthError",
    "AuthenticationError",
    "InvalidRequestError",
]
