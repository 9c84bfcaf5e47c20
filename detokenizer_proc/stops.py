"""Stop strings that may span tokens.

Text reaches the client only once it cannot be the start of a stop string: the longest suffix
that is a proper prefix of some stop string is held back. A stop string therefore can never
begin inside text already sent, so searching the held-back buffer alone finds every match.
On a match, the text before the stop string is released and the stop string itself never is.
"""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: list[str] | tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._chars = frozenset("".join(self.stops))  # fast path: most text holds none
        self._pending = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add decoded text; return what may be sent now. Sets `matched` on a stop string."""
        if not self.stops:
            return text
        if self.matched is not None:
            return ""
        buf = self._pending + text
        first = -1
        for stop in self.stops:
            at = buf.find(stop)
            if at >= 0 and (first < 0 or at < first):
                first, self.matched = at, stop
        if first >= 0:
            self._pending = ""
            return buf[:first]
        hold = 0
        if not buf or buf[-1] not in self._chars:
            self._pending = ""
            return buf
        for stop in self.stops:
            for k in range(min(len(buf), len(stop) - 1), hold, -1):
                if buf.endswith(stop[:k]):
                    hold = k
                    break
        self._pending = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold]

    def flush(self) -> str:
        """At the end of the sequence: a held-back partial match was just text after all."""
        rest, self._pending = self._pending, ""
        return rest if self.matched is None else ""
