"""SamplingParams' own checks of logit_bias and grammar (the rest is covered where it is read)."""

from __future__ import annotations

import pytest

from tessera.bus.messages import GrammarSpec, ParamError, SamplingParams


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
    assert problem is not None and problem.param == "logit_bias"
    assert problem.message.startswith("logit_bias") and words in problem.message


def test_grammar_checks() -> None:
    ok = SamplingParams(grammar=GrammarSpec("regex", "a+", "regex"))
    assert ok.validate() is None
    assert SamplingParams(grammar=GrammarSpec("json_object")).validate() is None
    def problem(sp: SamplingParams) -> ParamError:
        found = sp.validate()
        assert found is not None
        return found

    kind = problem(SamplingParams(grammar=GrammarSpec("yaml", "x")))
    assert kind.param == "response_format" and "one of" in kind.message
    empty = problem(SamplingParams(grammar=GrammarSpec("regex", "", "regex")))
    assert empty == ParamError("regex", "regex: the regex is empty")
    mixed = problem(SamplingParams(grammar=GrammarSpec("regex", "a", "regex"), min_tokens=2))
    assert mixed.param == "min_tokens" and "regex" in mixed.message
    back = SamplingParams.from_dict({"grammar": {"kind": "regex", "spec": "a+",
                                                 "param": "regex"}})
    assert back == ok
    with pytest.raises(ValueError, match="unknown grammar"):
        SamplingParams.from_dict({"grammar": {"kind": "regex", "spec": "a", "x": 1}})


@pytest.mark.parametrize("values,param", [
    ({"temperature": -1.0}, "temperature"),
    ({"n": 0}, "n"),
    ({"max_tokens": 4, "min_tokens": 9}, "min_tokens"),
    ({"embed": "max"}, "embed"),
    ({"embed": "last", "n": 2}, "n"),
    ({"stop": ["a", ""]}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
])
def test_every_problem_names_its_field(values: dict, param: str) -> None:
    """The field is data, not the first word of the message: a message may start otherwise."""
    problem = SamplingParams(**values).validate()
    assert problem is not None and problem.param == param and problem.message
