"""Errors of ``maxfx serve`` in OpenAI's JSON shape, with the status codes OpenAI's clients map to exceptions.

``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``: 400 →
``openai.BadRequestError``, 401 → ``AuthenticationError``, 404 → ``NotFoundError``,
503 → ``InternalServerError`` (the client retries it).

Example:
    >>> err = APIError(404, "The model 'x' does not exist", param="model", code="model_not_found")
    >>> err.body()["error"]["type"]
    'not_found_error'
"""

from __future__ import annotations

from typing import Any

__all__ = ["APIError", "bad_request"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "server_overloaded",
    500: "internal_error",
}


class APIError(Exception):
    """An error answered as OpenAI's error body with ``status``.

    Args:
        status: the HTTP status code.
        message: what went wrong and what is expected (names the field).
        param: the request field at fault, if any.
        code: OpenAI's machine-readable code (``model_not_found``, ``invalid_api_key``...).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = int(status), message, param, code

    def body(self) -> dict[str, Any]:
        """OpenAI's error object."""
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None) -> APIError:
    """A 400 `APIError` (invalid field values, prompts too long, schemas that do not compile)."""
    return APIError(400, message, param=param, code="invalid_request")
