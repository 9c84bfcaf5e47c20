"""The scheduler process: continuous batching, chunked prefill, radix prefix cache, paged KV.

Chip-independent (numpy only: no torch, no hal). `Scheduler` is the core, driven without sockets
by tests and benchmarks; `process.SchedulerProcess` wires it to the bus.
"""
