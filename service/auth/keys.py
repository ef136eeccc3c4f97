"""API keys: ``fdsa_<prefix>_<secret>``, made with ``secrets`` and stored only as a SHA-256 hash.

The prefix (12 hex characters) is stored in clear and indexed so a request finds its key row in one
lookup; the whole key is then compared by hash in constant time. The key itself is shown once, at
creation. Why a fast hash is enough: see ``service.core.models.ApiKey``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.core.input_checks import control_character
from service.core.models import ApiKey, Tenant, utcnow

KEY_SCHEME = "fdsa"


@dataclass(frozen=True)
class NewKey:
    key: str
    prefix: str
    key_hash: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> NewKey:
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)  # 32 random bytes
    key = f"{KEY_SCHEME}_{prefix}_{secret}"
    return NewKey(key=key, prefix=prefix, key_hash=hash_key(key))


def parse_prefix(key: str) -> str | None:
    scheme, _, rest = key.partition("_")
    prefix, _, secret = rest.partition("_")
    if scheme != KEY_SCHEME or len(prefix) != 12 or not secret:
        return None
    return prefix


TENANT_NAME_MAX = 64  # tenants.name is VARCHAR(64)
KEY_LABEL_MAX = 128  # api_keys.name is VARCHAR(128)


def check_tenant_name(name: str) -> None:
    """``ValueError`` naming the problem unless ``name`` is 1-64 characters without control characters or
    surrounding blanks (PostgreSQL refuses a NUL outright; the rest would show garbled in logs and pages)."""
    where = control_character(name)
    if where is not None:
        raise ValueError(f"The tenant name contains a control character ({where}).")
    if not name.strip() or name != name.strip():
        raise ValueError("The tenant name must not be empty or start or end with blanks.")
    if len(name) > TENANT_NAME_MAX:
        raise ValueError(f"The tenant name is {len(name)} characters long; at most {TENANT_NAME_MAX}.")


def check_key_label(label: str) -> None:
    where = control_character(label)
    if where is not None:
        raise ValueError(f"The key's name contains a control character ({where}).")
    if len(label) > KEY_LABEL_MAX:
        raise ValueError(f"The key's name is {len(label)} characters long; at most {KEY_LABEL_MAX}.")


def ensure_tenant(session: Session, name: str) -> Tenant:
    """The tenant called ``name``, created if missing (safe against a concurrent creator)."""
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is not None:
        return tenant
    try:
        with session.begin_nested():
            tenant = Tenant(name=name)
            session.add(tenant)
        return tenant
    except IntegrityError:
        return session.scalars(select(Tenant).where(Tenant.name == name)).one()


def create_api_key(session: Session, tenant_name: str, name: str = "") -> tuple[str, ApiKey]:
    """Create a key for ``tenant_name`` (creating the tenant if needed); returns the key, shown once.
    ``ValueError`` for a tenant name or key label that cannot be stored as it is."""
    check_tenant_name(tenant_name)
    check_key_label(name)
    tenant = ensure_tenant(session, tenant_name)
    new = generate_key()
    row = ApiKey(tenant=tenant, prefix=new.prefix, key_hash=new.key_hash, name=name)
    session.add(row)
    session.flush()
    return new.key, row


def authenticate(session: Session, key: str) -> Tenant | None:
    """The tenant owning ``key``, or None for an unknown, malformed or revoked key."""
    prefix = parse_prefix(key)
    if prefix is None or control_character(prefix) is not None:
        return None
    wanted = hash_key(key)
    for row in session.scalars(select(ApiKey).where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))):
        if hmac.compare_digest(row.key_hash, wanted):
            return row.tenant
    return None


def revoke_api_key(session: Session, prefix: str) -> int:
    rows = session.scalars(select(ApiKey).where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))).all()
    for row in rows:
        row.revoked_at = utcnow()
    return len(rows)
