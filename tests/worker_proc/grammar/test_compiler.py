"""Compiling off the step path: every kind of grammar, the cache, errors that name the field."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tessera.bus.messages import GrammarSpec
from tessera.worker_proc.grammar.compiler import GrammarCompileError, GrammarCompiler
from tessera.worker_proc.grammar.vocab import GrammarUnavailable, tokenizer_info

SPECS = [
    GrammarSpec("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}',
                "response_format"),
    GrammarSpec("json_object", "", "response_format"),
    GrammarSpec("regex", "(yes|no)[0-9]+", "regex"),
    GrammarSpec("grammar", 'root ::= "a" root | "b"', "ebnf"),
    GrammarSpec("grammar", 'start: "x" NUM\nNUM: /[0-9]+/', "guided_grammar"),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.param + "-" + s.kind)
def test_every_kind_compiles(info: Any, spec: GrammarSpec) -> None:
    compiler = GrammarCompiler(lambda: info)
    assert compiler.submit(spec).result(timeout=60) is not None
    compiler.close()


def test_same_spec_compiles_once_and_failures_are_cached(info: Any) -> None:
    calls = []
    compiler = GrammarCompiler(lambda: calls.append(1) or info)
    first = compiler.submit(SPECS[2])
    assert compiler.submit(SPECS[2]) is first and compiler.compiles == 1
    assert compiler.hits == 1 and first.result(timeout=60) is not None
    bad = GrammarSpec("json_schema", '{"type": "object", "properties": ', "guided_json")
    with pytest.raises(GrammarCompileError, match="^guided_json: the json schema cannot be used"
                       ) as info:
        compiler.submit(bad).result(timeout=60)
    assert ".cc:" not in str(info.value)  # no C++ log location in what the user reads
    assert compiler.submit(bad).done()  # answered from the cache
    assert calls == [1]  # the vocabulary was read once
    compiler.close()


def test_a_compile_does_not_hold_the_caller(info: Any) -> None:
    gate = threading.Event()

    def slow_info() -> Any:
        gate.wait(10)
        return info

    compiler = GrammarCompiler(slow_info)
    future = compiler.submit(SPECS[0])
    assert not future.done()  # submit returned while the compile waits
    assert compiler.submit(SPECS[2]) is not future  # the cache answers without blocking
    gate.set()
    assert future.result(timeout=60) is not None
    compiler.close()


def test_a_model_without_tokenizer_cannot_serve_grammars(tmp_path) -> None:  # noqa: ANN001
    config = tmp_path / "config.json"
    config.write_text('{"vocab_size": 100, "architectures": ["LlamaForCausalLM"]}')
    with pytest.raises(GrammarUnavailable, match="tokenizer"):
        tokenizer_info(str(config), 100, [2])


def test_json_object_means_an_object_with_any_properties(info: Any) -> None:
    import xgrammar as xgr

    compiler = GrammarCompiler(lambda: info)
    compiled = compiler.submit(GrammarSpec("json_object", "", "response_format")).result(60)
    for text, ok in (('{"a": [1, {"b": null}], "c": "x"}', True), ("{}", True),
                     ("[1]", False), ('"text"', False)):
        matcher = xgr.GrammarMatcher(compiled)
        assert (matcher.accept_string(text) and matcher.is_completed()) == ok, text
    compiler.close()
