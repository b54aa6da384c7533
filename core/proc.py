"""The one subprocess helper: resolve the program, log the command, capture, raise typed errors."""

from __future__ import annotations

import os
import selectors
import shlex
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from core import redact
from core.errors import CommandFailed, CommandTimeout, ToolchainMissing

log = redact.logger("dgr.proc")

TAIL_LINES = 40


@dataclass(frozen=True, kw_only=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    output: str
    seconds: float


def resolve(program: str, env: Mapping[str, str] | None = None) -> str:
    """Absolute path of ``program`` on the PATH of ``env``; ToolchainMissing when absent."""
    if os.sep in program:
        if os.access(program, os.X_OK):
            return program
        raise ToolchainMissing(f"{program} is not an executable file")
    path = (env or os.environ).get("PATH", os.defpath)
    found = shutil.which(program, path=path)
    if found is None:
        raise ToolchainMissing(f"`{program}` is not on PATH", hint=f"install {program} and retry")
    return found


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    no_output_timeout: float | None = None,
    echo: bool = False,
    check: bool = True,
    stdin_data: bytes | None = None,
) -> Completed:
    """Run a command to completion, merging stdout and stderr.

    ``no_output_timeout`` kills the child when it prints nothing for that many seconds (a hung
    compiler or worker), which a plain wall-clock timeout cannot tell apart from a long build.
    ``echo`` streams output lines to our stderr as they come (long builds show progress).
    """
    args = [os.fspath(a) for a in argv]
    args[0] = resolve(args[0], env)
    log.info("$ %s", shlex.join(args))
    started = time.monotonic()
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    proc = _spawn(args, cwd=cwd, env=env, stdin_data=stdin_data)
    raw = _drain(proc, args, tail, no_output_timeout=no_output_timeout, echo=echo)
    output = raw.decode("utf-8", "replace")
    done = Completed(
        argv=tuple(args), returncode=proc.returncode, output=output, seconds=time.monotonic() - started
    )
    if check and proc.returncode != 0:
        raise CommandFailed(args, proc.returncode, "\n".join(tail))
    return done


def _spawn(
    args: list[str], *, cwd: Path | None, env: Mapping[str, str] | None, stdin_data: bytes | None
) -> subprocess.Popen[bytes]:
    """Start the child with stderr merged into one stdout pipe; its stdin, if any, is written whole
    and closed up front (no stdin: /dev/null, so a child that reads it does not hang on ours)."""
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    if stdin_data is not None:
        assert proc.stdin is not None
        proc.stdin.write(stdin_data)
        proc.stdin.close()
    return proc


def _drain(
    proc: subprocess.Popen[bytes],
    args: list[str],
    tail: deque[str],
    *,
    no_output_timeout: float | None,
    echo: bool,
) -> bytes:
    """All the child's output once it has exited; whatever ends the read (EOF, the no-output timeout,
    ^C), the pipe is closed and the child is not left running."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    chunks: list[bytes] = []
    try:
        _read_to_eof(proc, sel, args, tail, chunks, no_output_timeout=no_output_timeout, echo=echo)
        proc.wait()
    finally:
        sel.close()
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return b"".join(chunks)


def _read_to_eof(
    proc: subprocess.Popen[bytes],
    sel: selectors.BaseSelector,
    args: list[str],
    tail: deque[str],
    chunks: list[bytes],
    *,
    no_output_timeout: float | None,
    echo: bool,
) -> None:
    """Read as output comes, into ``chunks`` (the raw bytes) and ``tail`` (the last lines, for the
    error); a silence longer than ``no_output_timeout`` stops the child and raises CommandTimeout."""
    assert proc.stdout is not None
    pending = b""
    while True:
        events = sel.select(timeout=no_output_timeout)
        if not events:
            proc.kill()
            proc.wait()
            raise CommandTimeout(
                f"`{shlex.join(args)}` printed nothing for {no_output_timeout:.0f} s and was stopped"
            )
        data = os.read(proc.stdout.fileno(), 65536)
        if not data:
            break
        chunks.append(data)
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            text = line.decode("utf-8", "replace")
            tail.append(text)
            if echo:
                print(text, file=sys.stderr, flush=True)
    if pending:
        tail.append(pending.decode("utf-8", "replace"))


def output_of(argv: Sequence[str | os.PathLike[str]], **kwargs: object) -> str:
    """Stripped combined output of a command that must succeed."""
    return run(argv, **kwargs).output.strip()  # type: ignore[arg-type]
