"""Structured logs: one JSON object per line on stderr.

Every record carries the job, pod, rank and world version from
:data:`context`, plus whatever ``extra={...}`` the call adds.

Why not a JSON-logging library (python-json-logger, structlog): the formatter
is twenty lines of the standard library, the trainer image would gain a
dependency for it, and the tests and the benchmarks parse these lines, so
their shape is a contract this module keeps.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

context: dict[str, Any] = {}
_STD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **context,
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "INFO") -> None:
    root = logging.getLogger("cohort")
    if not any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("cohort") else f"cohort.{name}")
