"""TLS for the bus and its clients: ``wss://`` with a certificate the operator gives.

``bcpbus serve --certfile CERT --keyfile KEY`` serves ``wss://``; a peer trusts it through the
system's certificate authorities, or through the CA file it is given (``--cafile``,
``Peer(..., cafile=...)``) for a private CA or a self-signed certificate. Both sides build their
:class:`ssl.SSLContext` here, so an unreadable or mismatched file is one line that names the
option, before anything listens or connects.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from .startup import StartupError

__all__ = ["client_context", "server_context"]


def server_context(certfile: Path | None, keyfile: Path | None) -> ssl.SSLContext | None:
    """The server side's TLS context, or None to serve plain ``ws://``.

    Raises:
        StartupError: one of the two files is missing, unreadable, not PEM, or the key does not
            match the certificate.
    """
    if certfile is None and keyfile is None:
        return None
    if certfile is None or keyfile is None:
        given, missing = ("--certfile", "--keyfile") if certfile else ("--keyfile", "--certfile")
        raise StartupError(f"{given} needs {missing} too: give both files to serve wss://")
    for option, path in (("--certfile", certfile), ("--keyfile", keyfile)):
        if not path.is_file():
            raise StartupError(f"{option} {path} is not a file: give the PEM file's path")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile)
    except (ssl.SSLError, OSError) as exc:
        raise StartupError(
            f"--certfile {certfile} --keyfile {keyfile}: cannot load them ({_reason(exc)}): give "
            "a PEM certificate chain and its unencrypted private key"
        ) from exc
    return context


def client_context(cafile: Path | None) -> ssl.SSLContext:
    """A client's TLS context: the system's CAs, or only those in ``cafile``.

    Raises:
        StartupError: ``cafile`` is missing or holds no PEM certificate.
    """
    if cafile is None:
        return ssl.create_default_context()
    if not cafile.is_file():
        raise StartupError(f"--cafile {cafile} is not a file: give the CA certificate (PEM)")
    try:
        return ssl.create_default_context(cafile=str(cafile))
    except (ssl.SSLError, OSError) as exc:
        raise StartupError(
            f"--cafile {cafile}: cannot load it ({_reason(exc)}): give a PEM CA certificate"
        ) from exc


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    return getattr(exc, "strerror", None) or str(exc)
