"""Logging of every tessera process: one line per record naming the process (and the request,
where one is being handled), as text or as JSON (`--log-format json`).

    text: 2026-01-02 10:00:00,123 scheduler[4242] INFO tessera.scheduler_proc.process: ...
          ... server[4250] INFO tessera.server.requests: rid=chatcmpl-1f2e request done ...
    json: {"time": "2026-01-02T10:00:00.123+00:00", "level": "INFO", "process": "server",
           "pid": 4250, "logger": "tessera.server.requests", "rid": "chatcmpl-1f2e",
           "message": "request done ...", ...extra fields}

The request id comes from `extra={"rid": ...}` on the call, else from `CURRENT_RID` (the server
sets it for the task that serves a request, so that every line logged on its behalf, in any
module, carries it).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
from contextvars import ContextVar
from typing import Any

CURRENT_RID: ContextVar[str | None] = ContextVar("tessera_rid", default=None)

# LogRecord attributes that are not "extra" fields of a JSON line.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime",
                                                                       "rid", "rid_tag"}


class RequestIdFilter(logging.Filter):
    """Sets `record.rid` (the request id or None) and `record.rid_tag` ("rid=X " or "")."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = getattr(record, "rid", None) or CURRENT_RID.get()
        record.rid = rid
        record.rid_tag = f"rid={rid} " if rid else ""
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname, "process": self.process, "pid": record.process,
            "logger": record.name, "message": record.getMessage(),
        }
        rid = getattr(record, "rid", None)
        if rid:
            out["rid"] = rid
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, int | float | str | bool) or \
                    value is None else str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup_logging(level: str, process: str, fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter(process))
    else:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s {process}[%(process)d] %(levelname)s %(name)s: %(rid_tag)s%(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        handlers=[handler], force=True)
