"""What holds before any request: ``import kerman`` and ``import kerman.providers`` import no
vendor SDK, a missing SDK names the extra to install, the clients a provider builds have the
SDK's retries off, reprs never show a key, and the error classes are ModelErrors."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from provider_helpers import OPENED, asynctest

import kerman
from kerman import errors
from kerman.providers import Anthropic, Gemini, OpenAIChat, OpenAIResponses
from kerman.providers.testing import FakeServer

SDKS = ("openai", "anthropic", "google.genai", "httpx", "httpx2")


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_importing_kerman_and_its_providers_imports_no_sdk():
    done = python(f"""
        import sys, kerman, kerman.providers, kerman.providers.testing
        from kerman.providers import OpenAIChat, OpenAIResponses, Anthropic, Gemini, Fallback, retry_policy
        print(sorted(m for m in sys.modules if m.split(".")[0] in {SDKS!r} or m.startswith("google.genai")))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "cls, module, extra",
    [
        ("OpenAIChat", "openai", "openai"),
        ("OpenAIResponses", "openai", "openai"),
        ("Anthropic", "anthropic", "anthropic"),
        ("Gemini", "google.genai", "gemini"),
    ],
)
def test_a_missing_sdk_names_the_extra_to_install(cls, module, extra):
    done = python(f"""
        import sys
        sys.modules[{module!r}] = None  # as if it were not installed
        from kerman.providers import {cls}
        try:
            {cls}("m", api_key="k")
        except ImportError as e:
            print(e)
    """)
    assert done.returncode == 0, done.stderr
    assert f"pip install 'kerman[{extra}]'" in done.stdout and cls in done.stdout


@asynctest
async def test_built_clients_have_the_sdks_retries_off_and_reprs_show_no_key():
    secret = "sk-secret-value-123456"
    chat = OpenAIChat("gpt-4.1", api_key=secret, base_url="http://user:pw@127.0.0.1:9/v1")
    responses = OpenAIResponses("gpt-4.1", api_key=secret, base_url="http://127.0.0.1:9/v1")
    claude = Anthropic("claude-sonnet-4-5", api_key=secret, base_url="http://127.0.0.1:9")
    gemini = Gemini("gemini-2.5-flash", api_key=secret, base_url="http://127.0.0.1:9")
    OPENED.extend([chat, responses, claude, gemini])
    assert chat.client.max_retries == 0 and responses.client.max_retries == 0 and claude.client.max_retries == 0
    assert gemini.client._api_client._http_options.retry_options.attempts == 1
    for model in (chat, responses, claude, gemini):
        assert secret not in repr(model) and "pw" not in repr(model)
    assert repr(chat) == "OpenAIChat('gpt-4.1', base_url='http://127.0.0.1:9/v1/')"
    assert repr(claude) == "Anthropic('claude-sonnet-4-5', max_tokens=4096, base_url='http://127.0.0.1:9')"
    assert repr(gemini) == "Gemini('gemini-2.5-flash', base_url='http://127.0.0.1:9')"


@asynctest
async def test_a_client_of_your_own_is_used_as_it_is():
    import openai

    client = openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1", max_retries=5)
    model = OpenAIChat("gpt-4.1", client=client)
    assert model.client is client and client.max_retries == 5
    with pytest.raises(TypeError):
        OpenAIChat("gpt-4.1", client=client, base_url="http://elsewhere/v1")
    await model.aclose()
    assert not client.is_closed()  # not the provider's to close
    await client.close()


def test_arguments_are_checked():
    with pytest.raises(ValueError):
        OpenAIChat("", api_key="k")
    with pytest.raises(TypeError):
        Anthropic("c", api_key="k", instructions=3)
    with pytest.raises(ValueError):
        OpenAIChat("m", api_key="k", max_tokens_field="max_output_tokens")
    with pytest.raises(ValueError):
        FakeServer("nope")


def test_the_error_classes_are_model_errors():
    classes = [
        errors.RateLimitError,
        errors.ServerError,
        errors.OverloadedError,
        errors.ModelTimeoutError,
        errors.ModelConnectionError,
        errors.ContextLengthError,
        errors.AuthenticationError,
        errors.InvalidRequestError,
    ]
    for cls in classes:
        assert issubclass(cls, kerman.ModelError) and cls.__name__ in errors.__all__
        e = cls("m", status=400, retry_after_ms=5, request_id="r")
        assert (e.message, e.status, e.retry_after_ms, e.request_id) == ("m", 400, 5, "r") and e.code
    assert issubclass(errors.OverloadedError, errors.ServerError)
    import kerman.providers as providers

    assert all(getattr(providers, cls.__name__) is cls for cls in classes)


def test_retry_after_headers():
    from kerman.providers._base import retry_after_ms

    assert retry_after_ms({"retry-after-ms": "250.5"}) == 251
    assert retry_after_ms({"retry-after": "1.5"}) == 1500
    assert retry_after_ms({"retry-after-ms": "nope", "retry-after": "2"}) == 2000
    now = 1_445_412_480.0  # 21 Oct 2015 07:28:00 GMT
    assert retry_after_ms({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}, now=now) == 30_000
    assert retry_after_ms({"retry-after": "Wed, 21 Oct 2015 07:27:00 GMT"}, now=now) == 0
    assert retry_after_ms({"retry-after": "soon"}) is None and retry_after_ms({}) is None and retry_after_ms(None) is None


@pytest.mark.parametrize(
    "status, kind, message, code, cls",
    [
        (408, None, "", "TIMEOUT", "ModelTimeoutError"),
        (409, None, "conflict", "CONFLICT", "ServerError"),
        (413, "request_too_large", "too big", "CONTEXT_LENGTH_EXCEEDED", "ContextLengthError"),
        (404, None, "model not found", "NOT_FOUND", "InvalidRequestError"),
        (422, None, "unprocessable", "BAD_REQUEST", "InvalidRequestError"),
        (400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", "AUTHENTICATION_FAILED", "AuthenticationError"),
        (403, None, "forbidden", "PERMISSION_DENIED", "AuthenticationError"),
        (502, None, "bad gateway", "SERVER_ERROR", "ServerError"),
        (None, "overloaded_error", "Overloaded", "OVERLOADED", "OverloadedError"),
        (None, "rate_limit_error", "slow down", "RATE_LIMITED", "RateLimitError"),
        (
            None,
            "invalid_request_error",
            "prompt is too long: 300000 tokens > 200000 maximum",
            "CONTEXT_LENGTH_EXCEEDED",
            "ContextLengthError",
        ),
        (None, "invalid_request_error", "messages.0: bad", "BAD_REQUEST", "InvalidRequestError"),
        (None, "billing_error", "add credits", "QUOTA_EXCEEDED", "RateLimitError"),
    ],
    ids=lambda v: str(v),
)
def test_classification(status, kind, message, code, cls):
    from kerman.providers import classify

    error = classify("p", status=status, kind=kind, message=message)
    assert (error.code, type(error).__name__, error.status) == (code, cls, status)


def test_messages_never_show_the_secret():
    from kerman.providers import classify

    error = classify("p", status=401, message="Incorrect API key provided: sk-abcdef123456.", secrets=["sk-abcdef123456"])
    assert "sk-abcdef123456" not in error.message and "***" in error.message
