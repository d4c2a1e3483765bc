"""The client's exceptions, and the API server's refusals turned into kubectl's words.

The API server answers a refused TrainingJob with a ``Status`` body (HTTP 422
for the schema and CEL rules, 400 for strict decoding); its ``details.causes``
name each field. :func:`api_error_message` writes them as kubectl does
(``The TrainingJob "x" is invalid: spec.replicas.min: Invalid value: ...``), so
a notebook shows the same line a terminal would.
"""

from __future__ import annotations

import json
from typing import Any


class CohortError(Exception):
    """Something the user can act on; the message says what (the CLI prints it and exits 1)."""


class ApiError(CohortError):
    """The API server refused a request. ``fields`` lists the fields its causes name."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "", fields: tuple[str, ...] = ()):
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.fields = fields


class NotFound(ApiError):
    """HTTP 404: no such object."""


class JobFailed(CohortError):
    """The job reached phase Failed while someone waited for another phase."""

    def __init__(self, message: str, job: Any = None):
        super().__init__(message)
        self.job = job


def _status_body(body: Any) -> dict[str, Any]:
    if isinstance(body, (bytes, bytearray)):
        body = body.decode(errors="replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except json.JSONDecodeError:
            return {"message": body.strip()}
    return body if isinstance(body, dict) else {}


def api_error_message(status: int, body: Any) -> tuple[str, str, tuple[str, ...]]:
    """(message as kubectl prints it, the Status reason, the fields named) for an error response."""
    st = _status_body(body)
    reason = str(st.get("reason") or "")
    message = str(st.get("message") or "").strip()
    details = st.get("details") or {}
    causes = [c for c in details.get("causes") or [] if isinstance(c, dict)]
    fields = tuple(str(c["field"]) for c in causes if c.get("field"))
    if status == 422 and causes:
        # kubectl (StandardErrorMessage): `The <kind> "<name>" is invalid: <field>: <message>`,
        # several causes as a bracketed list, each `field: message`.
        head = "The request is invalid"
        if details.get("kind") or details.get("name"):
            head = f'The {details.get("kind", "")} "{details.get("name", "")}" is invalid'
        errs = [f"{c['field']}: {c.get('message', '')}" if c.get("field") else str(c.get("message", ""))
                for c in causes]
        return f"{head}: {errs[0] if len(errs) == 1 else '[' + ', '.join(errs) + ']'}", reason, fields
    if not message:
        message = f"HTTP {status}"
    return f"Error from server ({reason or status}): {message}", reason, fields


def from_api_exception(e: Any) -> ApiError:
    """An ApiError for a kubernetes.client ApiException (or anything with ``status`` and ``body``)."""
    status = int(getattr(e, "status", 0) or 0)
    message, reason, fields = api_error_message(status, getattr(e, "body", None) or getattr(e, "reason", ""))
    cls = NotFound if status == 404 else ApiError
    return cls(message, status=status, reason=reason, fields=fields)
