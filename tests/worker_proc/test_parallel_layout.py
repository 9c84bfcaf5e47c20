"""Where each of --tp-size x --pp-size workers sits: its stage, its TP rank, its peer in the
next stage, and which one answers the scheduler."""

from __future__ import annotations

import pytest

from tessera.worker_proc.parallel import RankLayout


def test_rank_layout_places_tp_ranks_within_stages() -> None:
    layouts = [RankLayout(r, tp_size=2, pp_size=2) for r in range(4)]
    assert [(x.stage, x.tp_rank) for x in layouts] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [x.answers for x in layouts] == [False, False, True, False]
    assert layouts[1].peer(1) == 3 and layouts[0].tp_groups() == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="outside --tp-size 2 x --pp-size 2"):
        RankLayout(4, 2, 2)
