"""The one redaction: what a message or a log line may show of a URL, and no secret anywhere.

RELIABILITY 23: a token, a URL's ``user:password`` or a key never reaches an output stream, a log
line, a traceback or a record, even when the request that carried it failed and a library put it into
its own error text.  So redaction is applied where messages are made, not by each caller:
- every ``DgrError`` scrubs its message and hint as it is made (``core.errors``);
- every logger of ours is made by ``logger`` here and scrubs each record before a handler sees it;
- a URL we show is ``redact_url``'d first: no user-info, no query (a storage host's signature).

``scrub`` hides the user-info of any URL in free text, any ``Bearer`` / ``Basic`` credential, and each
secret the process has read (``remember``: the hub token, an endpoint's password), spelled as it was
read or as ``repr`` escapes it.
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import urlsplit, urlunsplit

HIDDEN = "***"
_MIN_SECRET = 6  # shorter secrets would hide ordinary text; a URL's user-info is hidden by its shape
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s?#'\"]*@")
_SCHEME_CREDENTIAL = re.compile(r"(?i)\b(Bearer|Basic)\s+[^\s'\"]+")
_known: set[str] = set()
_known_lock = threading.Lock()


def remember(secret: str | None) -> None:
    """From now on ``scrub`` hides ``secret`` wherever it appears (and each of its lines)."""
    if not secret:
        return
    spellings = {secret, repr(secret)[1:-1], *secret.splitlines()}
    with _known_lock:
        _known.update(s for s in spellings if len(s.strip()) >= _MIN_SECRET)


def scrub(text: str) -> str:
    """``text`` with every secret we know of, URL user-info and Authorization credential hidden."""
    with _known_lock:
        known = sorted(_known, key=len, reverse=True)  # a secret containing another goes first
    for secret in known:
        text = text.replace(secret, HIDDEN)
    text = _USERINFO.sub(rf"\1{HIDDEN}@", text)
    return _SCHEME_CREDENTIAL.sub(rf"\1 {HIDDEN}", text)


def redact_url(url: str) -> str:
    """A URL for messages, logs and records: user-info hidden, no query or fragment; never raises
    (a URL too malformed to split is scrubbed as text)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return scrub(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    netloc = f"{HIDDEN}@{host}" if at and userinfo else host
    return scrub(urlunsplit((parts.scheme, netloc, parts.path, "", "")))


class ScrubFilter(logging.Filter):
    """Renders a record's message once, scrubbed, so no handler formats the raw arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = scrub(record.getMessage())
        record.args = None
        return True


def logger(name: str) -> logging.Logger:
    """Our logger ``name``, scrubbing every record it makes (a filter on the logger itself, so it holds
    for any handler: the CLI's stderr, a test's capture)."""
    made = logging.getLogger(name)
    if not any(isinstance(f, ScrubFilter) for f in made.filters):
        made.addFilter(ScrubFilter())
    return made
