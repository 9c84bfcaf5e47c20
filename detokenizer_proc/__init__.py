"""Token ids to text for each request's client: incremental UTF-8-safe decoding
(`incremental.py`), stop strings (`stops.py`), per-request state (`sequence.py`), routing
(`router.py`) and the bus process (`process.py`)."""
