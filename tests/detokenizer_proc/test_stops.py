"""Stop strings that span deltas: found, never sent, text before them released."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tessera.detokenizer_proc.stops import StopStrings


def feed_all(stops, chunks):
    s = StopStrings(stops)
    sent = [s.feed(c) for c in chunks]
    return sent, s


def test_stop_across_chunks_not_emitted():
    sent, s = feed_all(["STOP"], ["abc S", "T", "OP and more"])
    assert "".join(sent) == "abc "
    assert s.matched == "STOP"
    assert sent == ["abc ", "", ""]  # "S" and "ST" held back until the match


def test_partial_match_released_when_it_breaks():
    sent, s = feed_all(["</end>"], ["a</e", "nx"])
    assert sent == ["a", "</enx"]
    assert s.matched is None


def test_partial_match_released_at_the_end():
    sent, s = feed_all(["###"], ["x#", "#"])
    assert "".join(sent) == "x"
    assert s.flush() == "##"


def test_earliest_of_several_stops_wins():
    sent, s = feed_all(["world", "lo w"], ["hello world"])
    assert sent == ["hel"] and s.matched == "lo w"


def test_unicode_stop():
    sent, s = feed_all(["。"], ["日本", "語。次"])
    assert "".join(sent) == "日本語" and s.matched == "。"


@given(text=st.text(max_size=40), stop=st.text(min_size=1, max_size=4),
       cuts=st.lists(st.integers(0, 40), max_size=8))
def test_any_split_gives_text_up_to_first_match(text, stop, cuts):
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    sent, s = feed_all([stop], chunks)
    out = "".join(sent) + s.flush()
    at = text.find(stop)
    assert out == (text if at < 0 else text[:at])
    assert (s.matched is not None) == (at >= 0)
