"""Incremental detokenization that never emits a broken character.

Token boundaries do not fall on character boundaries: a byte-level BPE splits an emoji or a
CJK character over several tokens, and a byte-fallback token is a single byte. Decoding each
token alone would print U+FFFD halves. Instead (as vLLM and HF's TextStreamer do) we decode a
small window of recent tokens twice, with and without the newest ones, and emit only the new
suffix, and only once it no longer ends in U+FFFD (an incomplete UTF-8 sequence at the end).

Invariant: the concatenation of every `step` result and the final `flush` equals
`tokenizer.decode(all_ids)`; no `step` result ends in the middle of a character.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDecoder:
    def __init__(self, tokenizer: Decoder, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        # ids[prefix_offset:read_offset] were emitted last time (context for the next window);
        # ids[read_offset:] are not emitted yet.
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, start: int, stop: int | None = None) -> str:
        return self._tokenizer.decode(self.ids[start:stop], skip_special_tokens=self._skip)

    def step(self, token_id: int) -> str:
        """Add one token; return the text that is now complete (possibly empty)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT):
            return ""  # nothing new yet, or a character still incomplete: hold it back
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        return new_text[len(prefix_text):]

    def flush(self) -> str:
        """The held-back rest at the end of the sequence (may hold U+FFFD if the model ended
        on an incomplete character, exactly as a full decode shows it)."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        self._prefix_offset = self._read_offset = len(self.ids)
        return new_text[len(prefix_text):]
