"""Inputs of the conformance suite (hal/conformance.py): paged-KV cases and sampling params.

Pages are 4 slots, so the lengths below put sequence ends before, on and after page
boundaries; page 0 is never handed out (it is the padding page, see KVArena), and the unused
tail of each `req_to_token` row holds valid but wrong slots, which a correct kernel never
reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from tessera.hal.ops import SamplingTensors

PAGE_SIZE = 4
HEAD_DIMS = (64, 128)
GQA_HEADS = ((8, 8), (8, 2), (8, 1))  # (query heads, KV heads): ratios 1, 4, 8
# name -> (seq_lens, extend_lens); the prefix of request b is seq_lens[b] - extend_lens[b]
EXTEND_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "empty_batch": ((), ()),
    "one_token": ((1,), (1,)),
    "prefill": ((5, 9, 16), (5, 9, 16)),
    "cached_prefix": ((8, 13, 12), (3, 1, 4)),  # prefixes 5, 12 (a page boundary), 8
    "mixed": ((1, 17, 4), (1, 6, 1)),
}
DECODE_SEQ_LENS: tuple[tuple[int, ...], ...] = ((), (1,), (1, 4, 5, 17))


@dataclass
class PagedCase:
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [S, Hk, D]
    v_cache: torch.Tensor
    req_to_token: torch.Tensor  # int32 [B, L]
    seq_lens: torch.Tensor  # int32 [B]
    extend_lens: torch.Tensor  # int32 [B]
    qo_indptr: torch.Tensor  # int32 [B + 1]
    scale: float

    def to(self, device: torch.device) -> PagedCase:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device).clone()
        return PagedCase(**moved)


def make_paged_case(seq_lens: tuple[int, ...], extend_lens: tuple[int, ...], hq: int, hk: int,
                    head_dim: int, dtype: torch.dtype, seed: int) -> PagedCase:
    gen = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    pages_per_req = [math.ceil(s / PAGE_SIZE) for s in seq_lens]
    num_pages = 1 + sum(pages_per_req) + 2  # padding page + used + two never-used pages
    num_slots = num_pages * PAGE_SIZE
    row_len = max((p * PAGE_SIZE for p in pages_per_req), default=0) + PAGE_SIZE
    # Shuffle the pages so that a request's KV is scattered, as after some churn.
    pages = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    req_to_token = torch.randint(0, num_slots, (batch, row_len), generator=gen,
                                 dtype=torch.int32)
    for b, n_pages in enumerate(pages_per_req):
        mine, pages = pages[:n_pages], pages[n_pages:]
        slots = [p * PAGE_SIZE + i for p in mine for i in range(PAGE_SIZE)]
        req_to_token[b, :len(slots)] = torch.tensor(slots, dtype=torch.int32)
    tokens = sum(extend_lens)
    qo_indptr = torch.zeros(batch + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.tensor(extend_lens, dtype=torch.int32).cumsum(0)
    return PagedCase(
        q=torch.randn((tokens, hq, head_dim), generator=gen).to(dtype),
        k_cache=torch.randn((num_slots, hk, head_dim), generator=gen).to(dtype),
        v_cache=torch.randn((num_slots, hk, head_dim), generator=gen).to(dtype),
        req_to_token=req_to_token,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        extend_lens=torch.tensor(extend_lens, dtype=torch.int32),
        qo_indptr=qo_indptr,
        scale=1.0 / math.sqrt(head_dim),
    )


def pad_paged_case(case: PagedCase, tokens: int, requests: int, seed: int) -> PagedCase:
    """`case` as a step captured at a larger size runs it: `tokens` more query rows (random,
    as stale buffer contents would be) owned by no request, and `requests` padding requests
    with seq_lens == extend_lens == 0 whose page-table rows name only slot 0 (page 0)."""
    gen = torch.Generator().manual_seed(seed)
    t = case.q.shape[0]
    extra_q = torch.randn((tokens, *case.q.shape[1:]), generator=gen).to(case.q.dtype)
    zeros = torch.zeros(requests, dtype=torch.int32)
    return PagedCase(
        q=torch.cat([case.q, extra_q]), k_cache=case.k_cache, v_cache=case.v_cache,
        req_to_token=torch.cat([case.req_to_token,
                                torch.zeros((requests, case.req_to_token.shape[1]),
                                            dtype=torch.int32)]),
        seq_lens=torch.cat([case.seq_lens, zeros]),
        extend_lens=torch.cat([case.extend_lens, zeros]),
        qo_indptr=torch.cat([case.qo_indptr, torch.full((requests,), t, dtype=torch.int32)]),
        scale=case.scale,
    )


def sampling_params(batch: int, device: torch.device | str = "cpu",
                    temperature: float | torch.Tensor = 1.0,
                    top_p: float | torch.Tensor = 1.0, top_k: int | torch.Tensor = 0,
                    min_p: float | torch.Tensor = 0.0, seeds: int | torch.Tensor = -1,
                    offsets: int | torch.Tensor = 0) -> SamplingTensors:
    """SamplingTensors for `batch` rows; a scalar applies to every row."""
    def col(value: float | int | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value.to(device=device, dtype=dtype)
        return torch.full((batch,), value, dtype=dtype, device=device)
    temps = col(temperature, torch.float32)
    top_ks = col(top_k, torch.int32)
    return SamplingTensors(
        temperature=temps, top_p=col(top_p, torch.float32), top_k=top_ks,
        min_p=col(min_p, torch.float32), seeds=col(seeds, torch.int64),
        offsets=col(offsets, torch.int64),
        all_greedy=bool(((temps <= 0) | (top_ks == 1)).all()) if batch else True,
    )
