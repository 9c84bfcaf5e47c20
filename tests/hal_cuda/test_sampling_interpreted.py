"""The cuda plugin's sampler on the CPU (Triton's interpreter)."""

from __future__ import annotations

from types import ModuleType

import torch

from tessera.hal.conformance_data import sampling_params


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def test_greedy_fast_path_and_greedy_rows(kernels: dict[str, ModuleType]) -> None:
    sample = kernels["sampling"].sample
    logits = _rand(4, 300, seed=1)
    logits[1, 5] = logits[1, 250] = logits[1].max() + 1  # a tie: the lowest index wins
    expected = logits.argmax(dim=-1)
    params = sampling_params(4, torch.device("cpu"), temperature=0.0)
    params.all_greedy = True
    assert torch.equal(sample(logits, params), expected) and expected[1] == 5
    # mixed: greedy rows (temperature 0, top_k 1) next to sampled rows
    mixed = sampling_params(4, torch.device("cpu"), temperature=torch.tensor([0.0, 1.0, 0.0, 1.0]),
                            top_k=torch.tensor([0, 1, 0, 0]), seeds=3)
    out = sample(logits, mixed)
    assert torch.equal(out[:3], expected[:3])


def test_seeded_row_ignores_batch_composition(kernels: dict[str, ModuleType]) -> None:
    sample = kernels["sampling"].sample
    logits = _rand(1, 500, seed=2) * 0.1  # nearly flat: the draw decides
    for seed in range(4):
        alone = sample(logits, sampling_params(1, torch.device("cpu"), temperature=1.0,
                                               seeds=seed, offsets=9))
        batch = torch.cat([_rand(2, 500, seed=10 + seed), logits])
        mixed = sample(batch, sampling_params(3, torch.device("cpu"), temperature=1.0,
                                              seeds=torch.tensor([-1, 4, seed]), offsets=9,
                                              top_p=torch.tensor([0.5, 1.0, 1.0])))
        assert mixed[2] == alone[0]
    draws = {int(sample(logits, sampling_params(1, torch.device("cpu"), temperature=1.0,
                                                seeds=1, offsets=o))[0]) for o in range(10)}
    assert len(draws) > 1


def test_filters_keep_exactly_the_allowed_tokens(kernels: dict[str, ModuleType]) -> None:
    sample = kernels["sampling"].sample
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(60, 1)
    for filters in ({"top_k": 2}, {"top_p": 0.6}, {"min_p": 0.5},
                    {"top_k": 3, "top_p": 0.99, "min_p": 0.3}):
        params = sampling_params(60, torch.device("cpu"), temperature=1.0,
                                 seeds=torch.arange(60), **filters)
        assert set(sample(logits, params).tolist()) == {0, 1}, filters


def test_top_p_falls_back_to_an_exact_threshold_on_flat_rows(kernels: dict[str, ModuleType],
                                                      monkeypatch) -> None:
    sampling = kernels["sampling"]
    monkeypatch.setattr(sampling, "CANDIDATES", 8)  # 8 of 64 flat tokens hold 1/8 < top_p
    logits = torch.zeros(50, 64)
    logits[:, 40:] = -30.0  # tokens 40.. are effectively impossible
    params = sampling_params(50, torch.device("cpu"), temperature=1.0, top_p=0.9,
                             seeds=torch.arange(50))
    tokens = sampling.sample(logits, params)
    assert int(tokens.max()) < 40 and len(set(tokens.tolist())) > 8


def test_distribution_matches_softmax(kernels: dict[str, ModuleType]) -> None:
    sample = kernels["sampling"].sample
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    n = 400
    params = sampling_params(n, torch.device("cpu"), temperature=0.5, seeds=torch.arange(n))
    tokens = sample(probs.log().repeat(n, 1), params)
    target = probs ** 2 / (probs ** 2).sum()
    freq = torch.bincount(tokens, minlength=4).float() / n
    sigma = (target * (1 - target) / n).sqrt()
    assert ((freq - target).abs() <= 5 * sigma).all(), (freq, target)


def test_apply_token_mask_matches_the_reference(kernels: dict[str, ModuleType]) -> None:
    from tessera.hal.cpu.token_mask import apply_token_mask as reference

    gen = torch.Generator().manual_seed(5)
    for vocab in (31, 32, 33, 1500):  # a block boundary inside the vocabulary at 1500
        logits = torch.randn(4, vocab, generator=gen)
        bitmask = torch.randint(-(2**31), 2**31 - 1, (2, (vocab + 31) // 32), generator=gen,
                                dtype=torch.int64).to(torch.int32)
        rows = torch.tensor([3, 1], dtype=torch.int32)
        expected = logits.clone()
        reference(expected, bitmask, rows)
        kernels["token_mask"].apply_token_mask(logits, bitmask, rows)
        assert torch.equal(logits, expected), vocab
        assert torch.isinf(logits[1]).any() and not torch.isinf(logits[0]).any()


def test_host_known_filters_give_the_same_draws_without_a_read_back(
        kernels: dict[str, ModuleType], monkeypatch) -> None:
    """SamplingTensors saying which filters are in use (the worker knows them from the
    request parameters): the same tokens, and the parameters are not read back from the
    device to choose the path."""
    sample = kernels["sampling"].sample
    logits = _rand(6, 400, seed=5)
    filters = {"top_k": torch.tensor([0, 5, 0, 50, 0, 0]),
               "top_p": torch.tensor([1.0, 0.9, 0.5, 1.0, 1.0, 1.0]),
               "min_p": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.2, 0.0])}
    params = sampling_params(6, torch.device("cpu"), temperature=0.8, seeds=torch.arange(6),
                             **filters)
    expected = sample(logits, params)
    params.any_top_k, params.any_top_p, params.any_min_p, params.max_top_k = True, True, True, 50

    def no_read_back(*args, **kwargs):
        raise AssertionError("the sampler read its filters back from the device")

    monkeypatch.setattr(torch, "stack", no_read_back)
    assert torch.equal(sample(logits, params), expected)


def test_exact_top_p_threshold_matches_the_sorted_rule(kernels: dict[str, ModuleType],
                                                       monkeypatch) -> None:
    """Rows whose candidates hold too little mass get the threshold a full sort would give:
    the value of the last token whose preceding mass is below top_p."""
    sampling = kernels["sampling"]
    monkeypatch.setattr(sampling, "CANDIDATES", 4)
    x = _rand(5, 300, seed=6) * 0.5  # flat: 4 candidates never hold top_p
    x[3, 7] = float("-inf")  # a forbidden token takes no part
    top_p = torch.tensor([0.3, 0.5, 0.9, 0.95, 0.99])
    params = sampling_params(5, torch.device("cpu"), temperature=1.0, top_p=top_p)
    got = sampling._thresholds(x, params)
    ordered = torch.sort(x, dim=-1, descending=True).values
    probs = torch.softmax(ordered, dim=-1)
    before = probs.cumsum(-1) - probs
    n_keep = (before < top_p[:, None]).sum(-1)
    expected = ordered.gather(1, (n_keep - 1)[:, None]).squeeze(1)
    assert torch.equal(got, expected)


def test_split_argmax_takes_the_lowest_index_of_the_maximum(kernels: dict[str, ModuleType],
                                                            monkeypatch) -> None:
    sampling = kernels["sampling"]
    monkeypatch.setattr(sampling, "ARGMAX_BLOCK", 16)  # 300 entries: 19 parts
    x = _rand(5, 300, seed=7)
    x[1, 40] = x[1, 250] = x[1].max() + 1  # tie across parts: 40
    x[2, 33] = x[2, 35] = x[2].max() + 1  # tie within a part: 33
    x[3] = float("-inf")  # nothing allowed: 0, as torch.argmax
    x[4, 299] = x[4].max() + 1  # the last, partial part
    got = sampling.argmax_rows(x)
    assert torch.equal(got, torch.argmax(x, dim=-1))
    assert got.tolist()[1:4] == [40, 33, 0] and got[4] == 299
