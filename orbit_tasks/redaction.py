"""The one URL redactor (issue 26 item 4): what a message or a log line may show of a URL. Pure.

The strictest of the three rules it replaces (``db.engine``, ``archive.engine.objects``,
``logs``): everything before the URL's last ``@`` after its scheme (user *and* password: a
lone user part may be a token, and a password may hold ``/``, ``?`` or ``#``, as SQLAlchemy
reads it) and any query or fragment are masked; scheme, host, port and path stay.
"""

from __future__ import annotations

import re

MASK = "***"

#: A URL inside free text (a log line): scheme://, then up to a space or a quote.
URL_IN_TEXT = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://[^\s'\"]*")


def redact_url(text: str, mask: str = MASK) -> str:
    """``text`` (a URL) for a message: ``scheme://***@host:port/path?***#`` -- the user info and
    any query or fragment replaced by ``mask``."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    userinfo, at, rest = rest.rpartition("@")
    shown = f"{scheme}{sep}{mask}@" if at else f"{scheme}{sep}"
    cuts = [i for i in (rest.find("?"), rest.find("#")) if i >= 0]
    if cuts:
        cut = min(cuts)
        rest = rest[: cut + 1] + mask
    return shown + rest


def redact_urls(text: str, mask: str = MASK) -> str:
    """Every ``scheme://`` URL inside ``text`` redacted by :func:`redact_url`."""
    return URL_IN_TEXT.sub(lambda m: redact_url(m.group(0), mask), text)
