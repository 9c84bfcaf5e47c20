"""Short codes that tie an error message to its row in docs/troubleshooting.md.

A leaf like tessera/config.py: every process, the HAL and the bus may import it. A message
ends with `coded(CODE)`, e.g. "model 'x' not found: ... [T101, docs/troubleshooting.md]", so
that an operator can search the page (or the log) for the code.
"""

from __future__ import annotations

DOC = "docs/troubleshooting.md"

MODEL_NOT_FOUND = "T101"
PLUGIN_MISSING = "T102"
PORT_IN_USE = "T103"
DIED_AT_START = "T104"
FIRST_REQUEST_HANGS = "T105"
GRAPH_CAPTURE_FAILED = "T106"
OUT_OF_MEMORY = "T107"
MULTI_DEVICE_TIMEOUT = "T108"
MEMORY_GROWS = "T109"
GARBLED_OUTPUT = "T110"
P99_JUMPS = "T111"
OVERLOADED = "T112"
PROCESS_HUNG = "T113"
NODE_LINK = "T114"
REPLICAS = "T115"

ALL: dict[str, str] = {
    MODEL_NOT_FOUND: "model path wrong or unreadable",
    PLUGIN_MISSING: "hardware plugin missing or fails to load",
    PORT_IN_USE: "HTTP port already in use",
    DIED_AT_START: "a process died before the engine was ready",
    FIRST_REQUEST_HANGS: "the engine is not ready / the first request hangs",
    GRAPH_CAPTURE_FAILED: "graph capture failed at start-up",
    OUT_OF_MEMORY: "out of device memory (weights, KV cache, graphs)",
    MULTI_DEVICE_TIMEOUT: "multi-device (tensor-parallel) set-up or collective times out",
    MEMORY_GROWS: "memory keeps growing",
    GARBLED_OUTPUT: "garbled or wrong output",
    P99_JUMPS: "P99 latency jumps",
    OVERLOADED: "requests fail with 503 (overloaded / unavailable)",
    PROCESS_HUNG: "a process stopped sending heartbeats (hung)",
    NODE_LINK: "several hosts: a node cannot join node 0, or a node is lost",
    REPLICAS: "--dp-size: the router is missing, or a replica fails",
}


def coded(code: str) -> str:
    """The suffix a message carries: ` [T101, docs/troubleshooting.md]`."""
    return f" [{code}, {DOC}]"
