"""One error hierarchy for the whole pipeline; each class owns an exit code.

The top-level handler in ``cli.main`` turns any ``DgrError`` into one clear line on stderr and its
exit code.  Messages say what failed and what to do next.  A message is scrubbed as the error is made
(``core.redact``): whatever a caller or a library put into it, no secret reaches a stream or a traceback.
"""

from __future__ import annotations

import errno

from core.redact import scrub

# What a write answers when the disk (or the user's quota) is full.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DgrError(Exception):
    exit_code = 1
    kind = "error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        message = scrub(message)
        super().__init__(message)
        self.message = message
        self.hint = scrub(hint) if hint else hint

    def one_line(self) -> str:
        text = f"dgr: {self.kind}: {self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return " ".join(text.split("\n"))


class ConfigurationError(DgrError):
    """Usage or configuration error: bad manifest, unknown recipe, bad argument."""

    exit_code = 2
    kind = "configuration error"


class IntegrityError(DgrError):
    """Digest mismatch, tampering, unsafe archive member or patch."""

    exit_code = 3
    kind = "integrity error"


class ToolchainMissing(DgrError):
    """A lane's toolchain is missing or too old."""

    exit_code = 4
    kind = "toolchain not found"


class GateFailed(DgrError):
    """A certification gate failed; the FAIL certificate has been written."""

    exit_code = 5
    kind = "gate failed"


class RuntimeFailure(DgrError):
    """A worker died or timed out, a download gave up, a command failed."""

    exit_code = 6
    kind = "runtime failure"


class DiskFull(RuntimeFailure):
    """A write stopped on a full disk (RELIABILITY 11, 25): exit 6, the code provisioning has always
    given it.  Provisioning says itself how many bytes the set still needs; every other writer lets the
    OSError rise, and ``cli.main`` turns it into this one line, so no folder needs its own handler."""

    @classmethod
    def from_os_error(cls, exc: OSError, *, during: str) -> DiskFull:
        where = f" writing {exc.filename}" if exc.filename else ""
        return cls(
            f"disk full{where} during {during}: {exc.strerror or 'no space left on device'}",
            hint="free space on the disk that holds the workspace, the store or the cache, and run again",
        )


class CommandFailed(RuntimeFailure):
    """A subprocess exited non-zero; carries its exit code and the tail of its output."""

    def __init__(self, argv: list[str], returncode: int, tail: str, *, hint: str | None = None) -> None:
        import shlex

        self.argv = list(argv)
        self.returncode = returncode
        self.tail = scrub(tail)
        last = tail.strip().splitlines()[-1] if tail.strip() else "no output"
        super().__init__(f"`{shlex.join(argv)}` exited {returncode}: {last}", hint=hint)


class CommandTimeout(RuntimeFailure):
    """A subprocess printed nothing for longer than its no-output timeout."""


class Terminated(BaseException):
    """SIGTERM, turned into an exception (by ``cli.main``) so every launcher and lock unwinds and no
    worker outlives us. A BaseException, like KeyboardInterrupt: no ``except Exception`` swallows it."""
