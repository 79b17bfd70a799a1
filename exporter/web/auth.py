"""Check HTTP basic authentication against ``basic_auth_users`` (bcrypt hashes).

A bcrypt check costs tens of milliseconds of CPU by design, on the node that trains. So a
credential that passed is remembered (as a digest, never the password) and so, for a minute,
is one that failed: a scraper's every scrape after its first costs a dictionary look-up, right
or wrong. Checks run one at a time, so that a flood of new wrong passwords takes at most one
core; a look-up never waits for them. An unknown user costs a check too, against a hash of the
users' own cost made at start, so that the time taken does not say which users exist.
Passwords are cut to bcrypt's 72 bytes, as Go's bcrypt and htpasswd do.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any

__all__ = ["BasicAuth", "bcrypt_module"]

#: Most credentials remembered, passed and failed each (the least recent one makes room).
REMEMBERED = 64
#: Seconds a failed credential is answered from memory.
FAILED_S = 60.0
#: bcrypt reads this many bytes of a password.
_BCRYPT_BYTES = 72


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
        self._check = threading.Lock()  # one bcrypt check at a time
        self._memo = threading.Lock()  # the remembered results; never held across a check
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._failed: OrderedDict[bytes, float] = OrderedDict()
        cost = min((int(h.split(b"$")[2]) for h in self._users.values()), default=10)
        self._decoy = self._bcrypt.hashpw(b"decoy", self._bcrypt.gensalt(cost))

    def allows(self, header: str | None) -> bool:
        """Return True for ``Basic <user:password>`` of a user of this configuration."""
        parsed = _credentials(header)
        if parsed is None:
            return False
        user, password = parsed
        hashed = self._users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), password, hashed or b""))).digest()
        now = time.monotonic()
        with self._memo:
            if key in self._passed:
                self._passed.move_to_end(key)
                return True
            if now - self._failed.get(key, -FAILED_S) < FAILED_S:
                return False
        with self._check:
            ok = self._verify(password[:_BCRYPT_BYTES], hashed)
        with self._memo:
            memory: OrderedDict[bytes, Any] = self._passed if ok else self._failed
            memory[key] = None if ok else now
            memory.move_to_end(key)
            while len(memory) > REMEMBERED:
                memory.popitem(last=False)
        return ok

    def _verify(self, password: bytes, hashed: bytes | None) -> bool:
        try:
            if hashed is None:
                self._bcrypt.checkpw(password, self._decoy)
                return False
            return bool(self._bcrypt.checkpw(password, hashed))
        except ValueError:  # a hash or a password bcrypt does not take
            return False


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
