"""The structured-output fields of a request, read into one GrammarSpec.

    response_format {"type": "text"}                          no constraint
    response_format {"type": "json_object"}                   any JSON object
    response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
    json_schema (a schema, or its JSON text), regex, ebnf     SGLang's extra fields
    guided_json, guided_regex, guided_choice, guided_grammar  vLLM's extra fields

At most one of them may be given (a forced tool call is a grammar too). The worker's grammar
engine compiles the grammar; a grammar it cannot use fails the request with 400 naming the
field. A JSON schema is always enforced strictly (no properties or items it does not name),
which also satisfies `strict: false`.
"""

from __future__ import annotations

import json
from typing import Any

from tessera.bus.messages import GrammarSpec
from tessera.server.errors import bad_request

GRAMMAR_FIELDS = ("response_format", "json_schema", "regex", "ebnf", "guided_json",
                  "guided_regex", "guided_choice", "guided_grammar")
MAX_CHOICES = 1024


def _schema_text(value: Any, where: str, param: str) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise bad_request(f"{where} is not valid JSON ({exc})", param) from None
    if not isinstance(value, dict):
        raise bad_request(f"{where} must be a JSON schema object", param)
    return json.dumps(value)


def _text(value: Any, param: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{param}' must be a non-empty string ({what})", param)
    return value


def _response_format(fmt: Any) -> GrammarSpec | None:
    param = "response_format"
    if not isinstance(fmt, dict):
        raise bad_request("'response_format' must be an object with a 'type'", param)
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object", "", param)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request("response_format.json_schema must be an object with 'name' and "
                              "'schema'", param)
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request("response_format.json_schema.strict must be true or false", param)
        schema = spec.get("schema")
        if schema is None:
            raise bad_request("response_format.json_schema.schema is required", param)
        return GrammarSpec("json_schema",
                           _schema_text(schema, "response_format.json_schema.schema", param),
                           param)
    raise bad_request(f"response_format.type must be text, json_object or json_schema, got "
                      f"{json.dumps(kind)[:40]}", param)


def _choice(value: Any) -> GrammarSpec:
    param = "guided_choice"
    if not isinstance(value, list) or not value or not all(
            isinstance(c, str) and c for c in value):
        raise bad_request("'guided_choice' must be a non-empty list of non-empty strings", param)
    if len(value) > MAX_CHOICES:
        raise bad_request(f"'guided_choice' has {len(value)} choices; at most {MAX_CHOICES}",
                          param)
    # An EBNF grammar whose root is one of the strings exactly (JSON escapes are EBNF's).
    root = " | ".join(json.dumps(c, ensure_ascii=False) for c in dict.fromkeys(value))
    return GrammarSpec("grammar", f"root ::= {root}", param)


def read_grammar(body: dict[str, Any]) -> GrammarSpec | None:
    given = [name for name in GRAMMAR_FIELDS if body.get(name) is not None]
    specs: list[GrammarSpec] = []
    for name in given:
        value = body[name]
        if name == "response_format":
            spec = _response_format(value)
        elif name in ("json_schema", "guided_json"):
            spec = GrammarSpec("json_schema", _schema_text(value, f"'{name}'", name), name)
        elif name in ("regex", "guided_regex"):
            spec = GrammarSpec("regex", _text(value, name, "a regular expression"), name)
        elif name in ("ebnf", "guided_grammar"):
            spec = GrammarSpec("grammar", _text(value, name, "an EBNF or Lark grammar"), name)
        else:
            spec = _choice(value)
        if spec is not None:
            specs.append(spec)
    if len(specs) > 1:
        raise bad_request(f"give one output constraint, not {', '.join(s.param for s in specs)}",
                          specs[1].param)
    return specs[0] if specs else None
