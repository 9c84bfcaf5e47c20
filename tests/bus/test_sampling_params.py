"""SamplingParams' own checks of logit_bias and grammar (the rest is covered where it is read)."""

from __future__ import annotations

import pytest

from tessera.bus.messages import GrammarSpec, SamplingParams


def test_logit_bias_as_a_dict_becomes_sorted_pairs() -> None:
    sp = SamplingParams(logit_bias={9: 1.5, 3: -100})
    assert sp.logit_bias == ((3, -100), (9, 1.5)) and sp.validate() is None
    assert SamplingParams.from_dict({"logit_bias": [[3, -100], [9, 1.5]]}) == sp
    assert SamplingParams.from_dict({"logit_bias": None}).logit_bias == ()


@pytest.mark.parametrize("bias,words", [
    ({-1: 1.0}, "token ids in [0, 2147483647]"),
    ({2**31: 1.0}, "token ids in [0, 2147483647]"),  # ids travel as int32
    ({2**70: 1.0}, "token ids in [0, 2147483647]"),  # msgpack carries 64 bits at most
    ({"7": 1.0}, "token ids"),
    ({7: 101}, "[-100, 100]"),
    ({7: True}, "[-100, 100]"),
    ({i: 1.0 for i in range(2000)}, "at most"),
])
def test_bad_logit_bias(bias: dict, words: str) -> None:
    problem = SamplingParams(logit_bias=bias).validate()
    assert problem is not None and problem.startswith("logit_bias") and words in problem


def test_grammar_checks() -> None:
    ok = SamplingParams(grammar=GrammarSpec("regex", "a+", "regex"))
    assert ok.validate() is None
    assert SamplingParams(grammar=GrammarSpec("json_object")).validate() is None
    assert "one of" in SamplingParams(grammar=GrammarSpec("yaml", "x")).validate()
    assert "empty" in SamplingParams(grammar=GrammarSpec("regex", "", "regex")).validate()
    assert "min_tokens" in SamplingParams(grammar=GrammarSpec("regex", "a", "regex"),
                                          min_tokens=2).validate()
    back = SamplingParams.from_dict({"grammar": {"kind": "regex", "spec": "a+",
                                                 "param": "regex"}})
    assert back == ok
    with pytest.raises(ValueError, match="unknown grammar"):
        SamplingParams.from_dict({"grammar": {"kind": "regex", "spec": "a", "x": 1}})
