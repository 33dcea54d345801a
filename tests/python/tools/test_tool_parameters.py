"""A tool's ``parameters`` must be a JSON Schema a tool can have; refused at registration with a
``ValueError`` naming what is wrong. The check is Kerman's own (no dependency); where the
``jsonschema`` package is installed, the cases are also checked against its meta-schema
validation, so the two agree on what is a JSON Schema at all."""

import math
from typing import Any, Dict, List

import pytest

import kerman
from kerman import Tool
from kerman.tools._check import schema_problem

try:
    import jsonschema
    import jsonschema.validators
except ImportError:  # the cross-checks are skipped
    jsonschema = None

needs_jsonschema = pytest.mark.skipif(jsonschema is None, reason="jsonschema is not installed")


def body(args: Dict[str, Any], ctx: Any) -> str:
    return "ran"


VALID: List[Dict[str, Any]] = [
    {"type": "object"},
    {"type": "object", "properties": {}},
    {"type": "object", "required": ["p"]},  # required without properties is JSON Schema
    {"type": "object", "properties": {"env": {"type": "string"}}, "required": ["env"]},
    {
        "type": "object",
        "title": "Deploy",
        "description": "Where and how.",
        "properties": {
            "env": {"type": "string", "enum": ["dev", "prod"], "default": "dev"},
            "name": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[a-z]+$", "format": "hostname"},
            "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "multipleOf": 1, "examples": [2, 3]},
            "ratio": {"type": ["number", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 1.5},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 0, "maxItems": 5.0, "uniqueItems": True},
            "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}, "propertyNames": {"pattern": "^x-"}},
            "mode": {"anyOf": [{"const": "fast"}, {"const": "slow"}]},
            "either": {"oneOf": [{"$ref": "#/$defs/point"}, {"type": "null"}]},
            "all": {"allOf": [{"type": "object"}, {"not": {"required": ["bad"]}}]},
            "cond": {"if": {"type": "string"}, "then": {"minLength": 1}, "else": {"type": "integer"}},
            "anything": True,
            "nothing": False,
            "patterned": {"type": "object", "patternProperties": {"^n_": {"type": "number"}}, "unevaluatedProperties": False},
            "x": {"x-vendor-extension": {"any": "thing"}, "deprecated": True, "readOnly": False},
        },
        "required": ["env"],
        "dependentRequired": {"name": ["env"]},
        "additionalProperties": False,
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}}},
        "$comment": "every keyword in use",
    },
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "pair": {"type": "array", "items": [{"type": "integer"}], "additionalItems": False},
            "ref": {"$ref": "#/definitions/d"},
        },
        "definitions": {"d": {"type": "string"}},
        "dependencies": {"pair": ["ref"], "ref": {"required": ["pair"]}},
    },
]

# What is not a JSON Schema at all (the jsonschema package refuses each too).
INVALID = [
    ({"type": "object", "properties": []}, "properties: expected an object mapping names to schemas, got list"),
    ({"type": "object", "properties": {"env": "string"}}, 'properties.env: expected a schema (an object or a boolean), got "string"'),
    (
        {"type": "object", "properties": {"env": {"type": "strnig"}}},
        'properties.env.type: "strnig" is not a JSON Schema type (one of "array", "boolean", "integer", "null", "number", "object", '
        '"string")',
    ),
    (
        {"type": "object", "properties": {"env": {"type": ["string", "string"]}}},
        "properties.env.type: expected a type name or a non-empty list of distinct type names",
    ),
    ({"type": "object", "properties": {"env": {"type": []}}}, "properties.env.type: expected a type name or a non-empty list"),
    ({"type": "object", "required": "env"}, 'required: expected a list of property names (strings), got "env"'),
    ({"type": "object", "required": [1]}, "required: expected a list of property names (strings), got list"),
    ({"type": "object", "properties": {"a": {}}, "required": ["a", "a"]}, "required: names a property twice"),
    ({"type": "object", "properties": {"a": {"minLength": -1}}}, "properties.a.minLength: expected a non-negative integer, got -1"),
    ({"type": "object", "properties": {"a": {"maxItems": 1.5}}}, "properties.a.maxItems: expected a non-negative integer, got 1.5"),
    ({"type": "object", "properties": {"a": {"minimum": "3"}}}, 'properties.a.minimum: expected a number, got "3"'),
    ({"type": "object", "properties": {"a": {"multipleOf": 0}}}, "properties.a.multipleOf: expected a number greater than 0, got 0"),
    ({"type": "object", "anyOf": []}, "anyOf: expected a non-empty list of schemas, got list"),
    ({"type": "object", "allOf": {"type": "object"}}, "allOf: expected a non-empty list of schemas, got dict"),
    ({"type": "object", "properties": {"a": {"enum": "ab"}}}, 'properties.a.enum: expected a list, got "ab"'),
    ({"type": "object", "properties": {"a": {"uniqueItems": "yes"}}}, 'properties.a.uniqueItems: expected a boolean, got "yes"'),
    ({"type": "object", "properties": {"a": {"items": 5}}}, "properties.a.items: expected a schema (an object or a boolean), got 5"),
    ({"type": "object", "properties": {"a": {"description": 5}}}, "properties.a.description: expected a string, got 5"),
    ({"type": "object", "$defs": {"d": []}}, "$defs.d: expected a schema (an object or a boolean), got list"),
    ({"type": "object", "dependentRequired": {"a": "b"}}, 'dependentRequired.a: expected a list of property names (strings), got "b"'),
    (
        {"type": "object", "properties": {"a": {"type": "array", "prefixItems": []}}},
        "properties.a.prefixItems: expected a non-empty list of schemas, got list",
    ),
    ({"type": "object", "properties": {"a b": {"type": "nope"}}}, 'properties["a b"].type: "nope" is not a JSON Schema type'),
]

# JSON Schema, but not what a tool's arguments can be described by (Kerman's own rules).
NOT_FOR_A_TOOL = [
    ({"properties": {"env": {"type": "string"}}}, 'a tool\'s arguments are an object: the schema needs "type": "object" at the top'),
    ({"type": "string"}, 'a tool\'s arguments are an object: the schema needs "type": "object" at the top, got "string"'),
    ({"type": ["object", "null"]}, 'a tool\'s arguments are an object: the schema needs "type": "object" at the top, got list'),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, 'required: names "b", which is not in properties'),
    (
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
        'properties.a.$ref: "#/$defs/missing" does not point to a part of the schema',
    ),
    (
        {"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}},
        'properties.a.$ref: "other.json#/x" points outside the schema; a tool\'s schema must be self-contained (#/$defs/...)',
    ),
    ({"type": "object", "properties": {"a": {"default": math.nan}}}, "properties.a.default: not JSON (Out of range float values"),
    ({"type": "object", "properties": {"a": {"enum": [{1, 2}]}}}, "properties.a.enum: not JSON (Object of type set"),
]


@pytest.mark.parametrize("schema", VALID, ids=range(len(VALID)))
def test_valid_schemas_are_accepted_as_given(schema: Dict[str, Any]) -> None:
    tool = Tool("t", body, parameters=schema)
    assert tool.parameters == schema and tool.spec()["parameters"] == schema
    assert schema_problem(schema) is None


@pytest.mark.parametrize("schema, problem", INVALID + NOT_FOR_A_TOOL, ids=range(len(INVALID) + len(NOT_FOR_A_TOOL)))
def test_invalid_schemas_are_refused_at_registration_naming_the_problem(schema: Any, problem: str) -> None:
    with pytest.raises(ValueError) as raised:
        Tool("deploy", body, parameters=schema)
    assert str(raised.value).startswith(f"tool 'deploy': invalid parameters schema: {problem}")
    loop = kerman.AgentLoop(kerman.models.ScriptedModel([]))
    with pytest.raises(ValueError, match="^tool 'deploy': invalid parameters schema: "):
        loop.tool(body, name="deploy", parameters=schema)
    assert loop.tools == {}


def test_parameters_that_are_not_a_dict_are_refused() -> None:
    for value, shown in (([], "list"), ("{}", "str"), (5, "int")):
        with pytest.raises(
            ValueError,
            match=rf"^tool 't': invalid parameters schema: expected a JSON Schema object \(a dict\), "
            rf"got {shown}$",
        ):
            Tool("t", body, parameters=value)


def test_a_schema_nested_too_deep_or_in_a_cycle_is_refused() -> None:
    deep: Dict[str, Any] = {"type": "string"}
    for _ in range(150):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ValueError, match="nested deeper than 100 levels"):
        Tool("t", body, parameters=deep)
    cyclic: Dict[str, Any] = {"type": "object", "properties": {}}
    cyclic["properties"]["self"] = cyclic
    with pytest.raises(ValueError, match="nested deeper than 100 levels"):
        Tool("t", body, parameters=cyclic)


@needs_jsonschema
@pytest.mark.parametrize("schema", VALID, ids=range(len(VALID)))
def test_jsonschema_agrees_the_valid_schemas_are_json_schema(schema: Dict[str, Any]) -> None:
    jsonschema.validators.validator_for(schema).check_schema(schema)


@needs_jsonschema
@pytest.mark.parametrize("schema, problem", INVALID, ids=range(len(INVALID)))
def test_jsonschema_agrees_the_invalid_schemas_are_not(schema: Dict[str, Any], problem: str) -> None:
    with pytest.raises(jsonschema.SchemaError):
        jsonschema.Draft202012Validator.check_schema(schema)


@needs_jsonschema
@pytest.mark.parametrize("schema, problem", NOT_FOR_A_TOOL[:6], ids=range(6))
def test_the_tool_rules_go_beyond_json_schema(schema: Dict[str, Any], problem: str) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)  # valid JSON Schema, refused for a tool
