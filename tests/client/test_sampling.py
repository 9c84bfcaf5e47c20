"""check_sampling: the one check of sampling parameters in a client process."""

from __future__ import annotations

import pytest

from tessera.bus.messages import SamplingParams
from tessera.client import BadRequestError, CheckedSampling, check_sampling


def test_values_are_checked_and_a_bad_one_names_its_field() -> None:
    checked = check_sampling({"temperature": 0.5}, {"max_tokens": 4})
    assert checked.params == SamplingParams(temperature=0.5, max_tokens=4)
    with pytest.raises(BadRequestError) as err:
        check_sampling(SamplingParams(top_p=0.0), {})
    assert err.value.param == "top_p" and err.value.status == 400


def test_checked_params_pass_as_they_are_and_overrides_are_checked_again() -> None:
    checked = check_sampling(None, {"max_tokens": 4})
    assert check_sampling(checked, {}) is checked
    assert check_sampling(checked, {"n": 2}).params.n == 2
    with pytest.raises(BadRequestError) as err:
        check_sampling(checked, {"n": 0})
    assert err.value.param == "n"
    assert isinstance(check_sampling(checked, {"seed": 1}), CheckedSampling)
