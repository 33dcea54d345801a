"""Structured output: what a turn's final reply must be (``output_type=``), the JSON schema each
provider sends with its own mechanism, and the validation of the reply against it.

``output_type`` is a pydantic model, a dataclass or a TypedDict (validated with pydantic's
``TypeAdapter``: ``pip install 'kerman[output]'``), or a JSON-schema ``dict`` (validated with
``jsonschema``, same extra). Neither package is imported until an output type is given.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Dict, List, Optional, Tuple

from .errors import ModelError

__all__ = ["OutputSpec", "OutputValidationError", "output_spec", "DEFAULT_OUTPUT_RETRIES"]

#: How many times an invalid final reply goes back to the model (with the validation error)
#: before the turn ends with ``OutputValidationError``.
DEFAULT_OUTPUT_RETRIES = 1

_EXTRA = "pip install 'kerman[output]'"


class OutputValidationError(ModelError):
    """The turn's final reply did not validate against its ``output_type``, also after the
    retries (``output_retries``): the turn ends ``{"kind": "error"}`` with code
    ``INVALID_OUTPUT``. ``errors`` is the last validation error's text."""

    def __init__(self, message: str, errors: str = "") -> None:
        super().__init__(message, "INVALID_OUTPUT")
        self.errors = errors


class OutputSpec:
    """One output type, ready to use: ``name`` and ``schema`` (what the provider sends),
    ``strict`` (whether OpenAI's strict mode can be used), ``strict_schema`` (the schema in
    OpenAI's strict form, which OpenAI's providers send: the schema itself when it is in that
    form already, a converted copy for a pydantic model, dataclass or TypedDict, ``None`` when
    there is none) and ``validate(text)``."""

    __slots__ = ("type", "name", "schema", "strict", "strict_schema", "_adapter", "_validator", "_nulls_added")

    def __init__(self, output_type: Any) -> None:
        self.type = output_type
        self._adapter: Any = None
        self._validator: Any = None
        self._nulls_added = False
        if isinstance(output_type, dict):
            jsonschema = _require("jsonschema", "a JSON-schema dict output_type")
            cls = jsonschema.validators.validator_for(output_type)
            try:
                cls.check_schema(output_type)
            except jsonschema.exceptions.SchemaError as e:
                raise ValueError(f"output_type is not a valid JSON schema: {e.message}") from None
            self._validator = cls(output_type)
            self.schema: Dict[str, Any] = output_type
            title = output_type.get("title")
            self.name = _name(title if isinstance(title, str) else "output")
        elif isinstance(output_type, type) or _is_typed_dict(output_type):
            pydantic = _require("pydantic", f"output_type={getattr(output_type, '__name__', output_type)!r}")
            if not (_is_model(output_type, pydantic) or dataclasses.is_dataclass(output_type) or _is_typed_dict(output_type)):
                raise TypeError(
                    f"output_type must be a pydantic model, a dataclass, a TypedDict or a JSON-schema dict, got {output_type!r}"
                )
            self._adapter = pydantic.TypeAdapter(output_type)
            self.schema = self._adapter.json_schema()
            self.name = _name(output_type.__name__)
        else:
            raise TypeError(f"output_type must be a pydantic model, a dataclass, a TypedDict or a JSON-schema dict, got {output_type!r}")
        self.strict_schema: Optional[Dict[str, Any]] = self.schema if _strict(self.schema) else None
        if self.strict_schema is None and self._adapter is not None:
            # pydantic's schemas leave objects open and optional fields out of `required`: the
            # strict form closes them and sends optional fields as nullable; the reply is
            # validated against the type itself, the nulls it sent for those dropped first.
            converted = strict_form(self.schema)
            if converted is not None:
                self.strict_schema = converted
                self._nulls_added = True
        self.strict = self.strict_schema is not None

    def validate(self, text: str) -> Tuple[Any, Any]:
        """``(value, json)``: the typed value and its JSON form (what the log keeps). Raises
        ``ValueError`` with the validation error's text for an invalid reply."""
        if self._adapter is not None:
            import pydantic

            if self._nulls_added:
                text = _without_added_nulls(text, self.schema)
            try:
                value = self._adapter.validate_json(text)
            except pydantic.ValidationError as e:
                raise ValueError(str(e)) from None
            return value, self._adapter.dump_python(value, mode="json")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"the reply is not JSON: {e}") from None
        errors = sorted(self._validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        if errors:
            raise ValueError("; ".join(f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors))
        return data, data

    def wire(self) -> Dict[str, Any]:
        """What ``ModelRequest.output`` carries to the provider."""
        return {"name": self.name, "schema": self.schema, "strict": self.strict, "strict_schema": self.strict_schema}

    def __repr__(self) -> str:
        shown = self.type.__name__ if isinstance(self.type, type) else "schema"
        return f"<OutputSpec {self.name!r} ({shown}) strict={self.strict}>"


def output_spec(output_type: Any) -> Optional[OutputSpec]:
    """``None`` for ``None``; an ``OutputSpec`` as it is; else a new one."""
    if output_type is None or isinstance(output_type, OutputSpec):
        return output_type
    return OutputSpec(output_type)


def _require(module: str, what: str) -> Any:
    try:
        return __import__(module)
    except ImportError as e:
        raise ImportError(f"{what} needs the {module!r} package: {_EXTRA}") from e


def _is_model(t: Any, pydantic: Any) -> bool:
    return isinstance(t, type) and issubclass(t, pydantic.BaseModel)


def _is_typed_dict(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, dict) and hasattr(t, "__required_keys__")


def _name(text: str) -> str:
    """A schema name the vendors accept (letters, digits, ``_`` and ``-``, 64 at most)."""
    cleaned = "".join(c if c.isalnum() or c in "_-" else "_" for c in text)[:64]
    return cleaned or "output"


def _strict(schema: Any) -> bool:
    """Whether ``schema`` is in OpenAI's strict subset as it is: every object closed
    (``additionalProperties: false``) and all of its properties required. Providers send
    ``strict`` only then (a strict request with another schema is refused by the API)."""
    if isinstance(schema, list):
        return all(_strict(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False or set(schema.get("required") or ()) != set(props):
            return False
    return all(_strict(v) for k, v in schema.items() if k not in ("enum", "const", "default", "examples"))


def openai_schema(output: Dict[str, Any]) -> Tuple[Any, bool]:
    """The schema and ``strict`` flag an OpenAI request sends for ``ModelRequest.output``: the
    strict form when there is one (``strict_schema``), else the schema as it is."""
    strict_schema = output.get("strict_schema")
    if output.get("strict") and strict_schema is not None:
        return strict_schema, True
    return output["schema"], bool(output.get("strict"))


class _NotStrict(Exception):
    """A schema that has no strict form (an open object such as ``Dict[str, int]``)."""


# Keywords whose values are data, not schemas: never walked.
_DATA_KEYWORDS = ("enum", "const", "default", "examples")


def strict_form(schema: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """A copy of ``schema`` (a pydantic-generated JSON schema) in OpenAI's strict form, or
    ``None`` when it has none: every object closed (``additionalProperties: false``) with all of
    its properties required, those that were optional made nullable (``anyOf`` with
    ``{"type": "null"}``) unless they already were; in ``$defs`` too. ``oneOf`` (a
    discriminated union) becomes ``anyOf`` (its ``discriminator`` dropped), a one-element ``allOf`` its element, a ``$ref``
    keeps no sibling keywords, and ``default`` values are dropped (the type's own defaults apply
    when the reply is validated)."""
    out = copy.deepcopy(schema)
    try:
        _close(out)
    except _NotStrict:
        return None
    return out


def _close(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _close(item)
        return
    if not isinstance(node, dict):
        return
    node.pop("default", None)
    if "$ref" in node:
        for key in [k for k in node if k != "$ref"]:
            del node[key]
        return
    if "oneOf" in node:
        node["anyOf"] = node.pop("oneOf")
        node.pop("discriminator", None)  # OpenAPI's, not JSON Schema's
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], dict):
        del node["allOf"]
        inner = all_of[0]
        for key, value in inner.items():
            node.setdefault(key, value)
        _close(node)
        return
    if node.get("type") == "object" or "properties" in node:
        props = node.get("properties")
        extra = node.get("additionalProperties")
        if not isinstance(props, dict) or extra not in (None, False):
            raise _NotStrict  # a map or an open object: no strict form
        required = set(node.get("required") or ())
        for key in list(props):
            if key not in required and not _nullable(props[key]):
                props[key] = {"anyOf": [props[key], {"type": "null"}]}
        node["required"] = list(props)
        node["additionalProperties"] = False
    for key, value in node.items():
        if key in _DATA_KEYWORDS:
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            for sub in value.values():
                _close(sub)
        elif isinstance(value, (dict, list)):
            _close(value)


def _nullable(schema: Any) -> bool:
    """Whether ``schema`` already admits ``null`` (as pydantic writes ``Optional[...]``)."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(_nullable(s) for s in schema.get("anyOf") or ())


def _without_added_nulls(text: str, schema: Dict[str, Any]) -> str:
    """The reply with the ``null`` values dropped that the strict form allowed where the type
    does not (an optional field the model left empty): its default then applies. Text that is
    not JSON, or has none, is returned as it is (the validator words the error)."""
    try:
        data = json.loads(text)
    except ValueError:
        return text
    defs = schema.get("$defs") or {}
    return json.dumps(data) if _drop_nulls(data, schema, defs, 0) else text


def _resolve(schema: Any, defs: Dict[str, Any]) -> Any:
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return defs.get(ref[len("#/$defs/") :], {})
    return schema


def _drop_nulls(value: Any, schema: Any, defs: Dict[str, Any], depth: int) -> bool:
    """Drops, in place, the nulls of ``value`` (JSON) where ``schema`` had an optional property
    that admits no null; True when one was dropped."""
    if depth > 64:
        return False
    schema = _resolve(schema, defs)
    if not isinstance(schema, dict):
        return False
    dropped = False
    branches: List[Any] = list(schema.get("anyOf") or ()) + list(schema.get("oneOf") or ()) + list(schema.get("allOf") or ())
    if isinstance(value, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            required = set(schema.get("required") or ())
            for key, sub in props.items():
                if key not in value:
                    continue
                if value[key] is None and key not in required and not _nullable(_resolve(sub, defs)):
                    del value[key]
                    dropped = True
                else:
                    dropped |= _drop_nulls(value[key], sub, defs, depth + 1)
        # A union of objects: the first branch the value's keys fit.
        for branch in branches:
            target = _resolve(branch, defs)
            if isinstance(target, dict) and isinstance(target.get("properties"), dict) and set(value) <= set(target["properties"]):
                dropped |= _drop_nulls(value, target, defs, depth + 1)
                break
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for item in value:
                dropped |= _drop_nulls(item, items, defs, depth + 1)
        for branch in branches:
            target = _resolve(branch, defs)
            if isinstance(target, dict) and isinstance(target.get("items"), dict):
                dropped |= _drop_nulls(value, target, defs, depth + 1)
                break
    return dropped


# -- the loop's side: the seams an output type uses (installed by AgentLoop when one is set) --


def spec_of(loop: Any, turn: int) -> Optional[OutputSpec]:
    """The output type of turn ``turn``: its run's, else the loop's."""
    spec: Optional[OutputSpec] = loop._output_turns.get(turn)
    return spec if spec is not None else loop._output_type


async def request_output(request: Any, next: Any) -> Any:
    """``before_request`` (first): the request carries the turn's output type to the provider."""
    loop = request.loop
    if loop is not None and request.output is None:
        spec = spec_of(loop, request.turn)
        if spec is not None:
            request.output = spec.wire()
    return await next()


def validate_output(stop: Any) -> None:
    """``turn_stopping`` (last): validates the turn's final reply against its output type. A
    valid one is logged (``output/validated``); an invalid one goes back to the model as
    context for one more step, ``output_retries`` times, then the turn fails
    (``OutputValidationError``, code ``INVALID_OUTPUT``)."""
    loop = stop.loop
    turn = stop.turn
    spec = spec_of(loop, turn)
    if spec is None or loop.inbox.next_step:
        return  # no output type, or another step follows anyway (a listener steered)
    log = loop.log
    seq = len(log) - 1
    reply = None
    while seq >= 0:
        event = log[seq]
        if event.type == "assistant/message":
            reply = event
            break
        if event.type == "turn/start":
            break
        seq -= 1
    if reply is None:
        return
    text = text_of(reply.data["message"])
    try:
        value, data = spec.validate(text)
    except ValueError as e:
        tried = loop._output_attempts.get(turn, 0)
        if tried >= loop._output_retries:
            loop._output_attempts.pop(turn, None)
            raise OutputValidationError(
                f"the reply does not match output type {spec.name!r} after {tried + 1} attempt(s): {_short(str(e))}", str(e)
            ) from None
        loop._output_attempts[turn] = tried + 1
        loop.inject(
            _context(
                f"Your reply is not valid output: {_short(str(e))}\n"
                f"Reply again with only a JSON value that matches the {spec.name!r} schema."
            )
        )
        return
    loop._output_attempts.pop(turn, None)
    loop._core.record_output(turn, reply.data["step"], data)
    loop._last_output = (turn, value)


def _context(text: str) -> Any:
    from ._core import UserMessage

    return UserMessage(text, source={"kind": "context", "plugin": "kerman.output"})


def text_of(message: Dict[str, Any]) -> str:
    """A logged message's text, as ``Message.text`` reads it (its text blocks, one per line)."""
    return "\n".join(b.get("text") or "" for b in message.get("content") or () if b.get("type") == "text")


def _short(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
