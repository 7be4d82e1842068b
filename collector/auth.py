"""Bearer-token checks shared by the HTTP and gRPC receivers (and the read API)."""

from __future__ import annotations

import hmac


def token_matches(presented: str | None, expected: str | None) -> bool:
    """True when no token is configured, or ``presented`` is ``Bearer <expected>``.

    The comparison is constant-time in the token's content.
    """
    if not expected:
        return True
    if not presented:
        return False
    scheme, _, value = presented.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), expected.encode())
