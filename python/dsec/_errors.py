"""One error hierarchy for every failure: the API's stable codes as exception classes."""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

#: Every API error code and its HTTP status (packages/protocol/src/errors.ts).
ERROR_STATUS: Dict[str, int] = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "SANDBOX_NOT_FOUND": 404,
    "LAYER_NOT_FOUND": 404,
    "PROCESS_NOT_FOUND": 404,
    "FILE_NOT_FOUND": 404,
    "NOT_FOUND": 404,
    "CONFLICT": 409,
    "SANDBOX_NOT_RUNNING": 409,
    "PAYLOAD_TOO_LARGE": 413,
    "LAYER_INVALID": 422,
    "IDEMPOTENCY_KEY_REUSED": 422,
    "QUOTA_EXCEEDED": 429,
    "RATE_LIMITED": 429,
    "ADMISSION_QUEUE_FULL": 429,
    "LIMIT_EXCEEDED": 429,
    "CANCELLED": 499,
    "INTERNAL": 500,
    "BACKEND_FAILED": 502,
    "CAPACITY_EXHAUSTED": 503,
    "UNAVAILABLE": 503,
    "TIMEOUT": 504,
    "COMMAND_FAILED": 422,
}

_STATUS_FALLBACK = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    422: "LAYER_INVALID",
    429: "RATE_LIMITED",
    502: "BACKEND_FAILED",
    503: "UNAVAILABLE",
    504: "TIMEOUT",
}


class DsecError(Exception):
    """Any dsec failure: a stable ``code``, its HTTP ``status``, a message and ``details``."""

    code: str = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        details: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.status = status if status is not None else ERROR_STATUS.get(self.code, 500)
        self.details: Dict[str, Any] = dict(details or {})

    @property
    def field(self) -> Optional[str]:
        """The request field an INVALID_ARGUMENT (or a not-found layer) names."""
        f = self.details.get("field")
        return f if isinstance(f, str) else None

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds the server asked to wait before trying again (429, 503), if it said."""
        ms = self.details.get("retryAfterMs")
        return ms / 1000.0 if isinstance(ms, (int, float)) else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, message={self.message!r})"


class InvalidArgumentError(DsecError):
    code = "INVALID_ARGUMENT"


class AuthenticationError(DsecError):
    code = "UNAUTHENTICATED"


class PermissionDeniedError(DsecError):
    code = "PERMISSION_DENIED"


class NotFoundError(DsecError):
    code = "NOT_FOUND"


class SandboxNotFoundError(NotFoundError):
    code = "SANDBOX_NOT_FOUND"


class LayerNotFoundError(NotFoundError):
    code = "LAYER_NOT_FOUND"


class ProcessNotFoundError(NotFoundError):
    code = "PROCESS_NOT_FOUND"


class FileNotFoundInSandboxError(NotFoundError):
    code = "FILE_NOT_FOUND"


class ConflictError(DsecError):
    code = "CONFLICT"


class SandboxNotRunningError(ConflictError):
    code = "SANDBOX_NOT_RUNNING"


class PayloadTooLargeError(DsecError):
    code = "PAYLOAD_TOO_LARGE"


class LayerInvalidError(DsecError):
    code = "LAYER_INVALID"


class IdempotencyKeyReusedError(DsecError):
    code = "IDEMPOTENCY_KEY_REUSED"


class TooManyRequestsError(DsecError):
    """Any 429: the caller should slow down (``retry_after`` says how long, when known)."""

    code = "RATE_LIMITED"


class RateLimitedError(TooManyRequestsError):
    code = "RATE_LIMITED"


class QuotaExceededError(TooManyRequestsError):
    code = "QUOTA_EXCEEDED"


class AdmissionQueueFullError(TooManyRequestsError):
    code = "ADMISSION_QUEUE_FULL"


class LimitExceededError(TooManyRequestsError):
    code = "LIMIT_EXCEEDED"


class CancelledError(DsecError):
    """The caller cancelled the call (``dsec.Cancel``, or an asyncio task's cancellation)."""

    code = "CANCELLED"


class InternalError(DsecError):
    code = "INTERNAL"


class BackendFailedError(DsecError):
    code = "BACKEND_FAILED"


class UnavailableError(DsecError):
    """The API (or a node) cannot be reached or is not serving: worth trying again later."""

    code = "UNAVAILABLE"


class CapacityExhaustedError(UnavailableError):
    code = "CAPACITY_EXHAUSTED"


class DsecTimeoutError(DsecError, TimeoutError):
    """A deadline passed (the call's, or the server's). Also a built-in ``TimeoutError``."""

    code = "TIMEOUT"


class CommandExitError(DsecError):
    """``exec(..., check=True)`` of a command that did not exit 0; ``result`` holds its output."""

    code = "COMMAND_FAILED"

    def __init__(self, result: Any, command: str, sandbox_id: Optional[str] = None) -> None:
        if result.timed_out:
            how = "timed out"
        elif result.signal:
            how = f"was killed by {result.signal}"
        else:
            how = f"exited with {result.exit_code}"
        tail = "\n".join(result.stderr.strip().split("\n")[-3:])
        super().__init__(
            f"command {how}: {command}" + (f"\n{tail}" if tail else ""),
            details={"sandboxId": sandbox_id, "pid": result.pid, "exitCode": result.exit_code},
        )
        self.result = result
        self.command = command

    @property
    def exit_code(self) -> Optional[int]:
        return self.result.exit_code  # type: ignore[no-any-return]

    @property
    def stdout(self) -> str:
        return self.result.stdout  # type: ignore[no-any-return]

    @property
    def stderr(self) -> str:
        return self.result.stderr  # type: ignore[no-any-return]


_BY_CODE: Dict[str, Type[DsecError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        AuthenticationError,
        PermissionDeniedError,
        NotFoundError,
        SandboxNotFoundError,
        LayerNotFoundError,
        ProcessNotFoundError,
        FileNotFoundInSandboxError,
        ConflictError,
        SandboxNotRunningError,
        PayloadTooLargeError,
        LayerInvalidError,
        IdempotencyKeyReusedError,
        RateLimitedError,
        QuotaExceededError,
        AdmissionQueueFullError,
        LimitExceededError,
        CancelledError,
        InternalError,
        BackendFailedError,
        UnavailableError,
        CapacityExhaustedError,
        DsecTimeoutError,
    )
}


def error_for(code: str, message: str, details: Optional[Dict[str, Any]] = None, status: Optional[int] = None) -> DsecError:
    """The exception of an API error code (an unknown code keeps the server's status)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        fallback = _STATUS_FALLBACK.get(status or 0, "INTERNAL")
        cls = _BY_CODE.get(fallback, InternalError)
        err = cls(message, code=code, status=status, details=details)
        return err
    return cls(message, status=status if status else None, details=details)


def invalid_argument(field: str, message: str) -> InvalidArgumentError:
    """A client-side 400 that names the field."""
    return InvalidArgumentError(f"{field}: {message}", details={"field": field})
