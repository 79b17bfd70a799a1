"""Check HTTP basic authentication against ``basic_auth_users`` (bcrypt hashes).

A bcrypt check costs tens of milliseconds of CPU by design, on the node that trains: a
credential that passed is remembered (as a digest, never the password), so a scraper's every
scrape after its first costs a dictionary look-up; checks run one at a time, so that a flood of
wrong passwords takes at most one core. An unknown user costs a check too, against a hash made
for that purpose, so that the time taken does not say which users exist.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from typing import Any

__all__ = ["BasicAuth", "bcrypt_module"]

#: Most credentials remembered as passed (the least recent one makes room).
REMEMBERED = 64


def bcrypt_module() -> Any:
    """Return the ``bcrypt`` module; raise ImportError naming the extra where it is missing."""
    try:
        import bcrypt
    except ImportError as exc:
        raise ImportError("basic_auth_users needs bcrypt: pip install 'ddp-exporter[web]'") from exc
    return bcrypt


class BasicAuth:
    """Say whether an ``Authorization`` header names a user of ``users`` with its password."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self._users = dict(users)
        self._bcrypt = bcrypt_module()
        self._lock = threading.Lock()
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._decoy: bytes | None = None

    def allows(self, header: str | None) -> bool:
        """Return True for ``Basic <user:password>`` of a user of this configuration."""
        parsed = _credentials(header)
        if parsed is None:
            return False
        user, password = parsed
        hashed = self._users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), password, hashed or b""))).digest()
        with self._lock:
            if hashed is not None and key in self._passed:
                self._passed.move_to_end(key)
                return True
            if hashed is None:
                if self._decoy is None:
                    self._decoy = self._bcrypt.hashpw(b"decoy", self._bcrypt.gensalt())
                self._bcrypt.checkpw(password, self._decoy)
                return False
            try:
                ok = bool(self._bcrypt.checkpw(password, hashed))
            except ValueError:  # a hash bcrypt does not take
                return False
            if ok:
                self._passed[key] = None
                while len(self._passed) > REMEMBERED:
                    self._passed.popitem(last=False)
            return ok


def _credentials(header: str | None) -> tuple[str, bytes] | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None
