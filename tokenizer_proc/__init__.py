"""The front door: validates GenerateRequests, applies the chat template, tokenizes, and hands
TokenizedRequests to the scheduler (`prepare.py` is the logic, `process.py` the bus process)."""
