"""core.redact: the one redaction every message and log line of ours goes through (RELIABILITY 23)."""

from __future__ import annotations

import logging

import pytest

from core import redact
from core.errors import CommandFailed, RuntimeFailure


def test_urls_lose_their_user_info_and_query_and_never_raise() -> None:
    assert redact.redact_url("https://u:s3cret@hub.example:8443/a/b?X-Amz-Signature=sig#f") == (
        "https://***@hub.example:8443/a/b"
    )
    assert redact.redact_url("http://127.0.0.1:9/x") == "http://127.0.0.1:9/x"
    assert redact.redact_url("http://[::1]:8080/x") == "http://[::1]:8080/x"
    assert redact.redact_url("http://u:p@[::1") == "http://***@[::1"  # too malformed to split


def test_free_text_loses_url_passwords_credentials_and_remembered_secrets() -> None:
    redact.remember("hf_remembered_Token\r\nX-Injected: 1")
    text = (
        "GET http://op:pa%40ss@mirror:1/x failed; "
        "header value: 'Bearer hf_remembered_Token\\r\\nX-Injected: 1'"
        " Authorization: Basic dXNlcjpwYXNz; raw hf_remembered_Token"
    )
    shown = redact.scrub(text)
    for secret in ("pa%40ss", "hf_remembered_Token", "X-Injected", "dXNlcjpwYXNz"):
        assert secret not in shown, shown
    assert "http://***@mirror:1/x" in shown and "Bearer ***" in shown


def test_every_error_and_log_line_is_scrubbed_where_it_is_made(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    url = "https://user:Hunter2-planted@git.example/llama.cpp.git"
    assert "Hunter2" not in RuntimeFailure(f"cannot fetch {url}", hint=f"try {url}").one_line()
    failed = CommandFailed(["git", "fetch", url], 128, f"fatal: unable to access '{url}'")
    assert "Hunter2" not in failed.one_line() + failed.tail + str(failed)
    redact.logger("dgr.test").info("$ git fetch %s", url)
    assert caplog.records and "Hunter2" not in caplog.text and "***@git.example" in caplog.text
