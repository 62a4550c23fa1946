"""Client TLS contexts built from ``TlsFiles`` settings (NATS; Redis and Postgres take the paths)."""

from __future__ import annotations

import ssl

from mailroom.settings import TlsFiles


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """A verifying client context: the system's CAs or ``ca_file``, and the client certificate.

    Hostname checks stay on: a certificate must name the host the URL names.
    """
    context = ssl.create_default_context(
        cafile=str(files.ca_file) if files.ca_file is not None else None
    )
    if files.cert_file is not None and files.key_file is not None:
        context.load_cert_chain(str(files.cert_file), str(files.key_file))
    return context
