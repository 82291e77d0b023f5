"""TLS for the two ways hashq reaches RabbitMQ: ``amqps://`` and the management API over
``https://``. One context per set of files, made when first needed, shared by every connection.
"""

from __future__ import annotations

import ssl
from functools import lru_cache
from pathlib import Path

from hashq.errors import SettingsError
from hashq.settings import Settings


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The client context the settings ask for, or ``None`` to keep the library's default (the
    system's CAs, and for ``amqps://`` whatever the URL's query names)."""
    if settings.tls_ca_file is None and settings.tls_cert_file is None:
        return None
    return _context(settings.tls_ca_file, settings.tls_cert_file, settings.tls_key_file)


@lru_cache(maxsize=8)
def _context(ca: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        if cert is not None:
            context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise SettingsError(f"TLS files cannot be used: {exc}") from None
    return context
