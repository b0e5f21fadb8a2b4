"""Principals from client certificates: Kafka's ``ssl.principal.mapping.rules``.

A client certificate's subject, written as RFC 2253 (most specific first, as Java's
``X500Principal.getName()`` writes it: ``CN=broker-1,O=lowtide``), is mapped to a name by the
first rule that matches; the principal is ``User:<name>``. Rules, comma-separated::

    DEFAULT                          the whole distinguished name
    RULE:<regex>/<replacement>/      <regex> must match the whole DN; $1, $2 ... are its groups
    RULE:<regex>/<replacement>/L     the same, lower-cased (U: upper-cased)

lowtide's local cluster and chart use ``RULE:^CN=([^,]+),O=lowtide$/$1/,DEFAULT`` so the
certificate for ``CN=broker-1,O=lowtide`` is ``User:broker-1``, the principal the ACLs already
check (docs/design/tls.md). No matching rule refuses the client, as Kafka's ``SslPrincipalMapper``
does.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from cryptography import x509

from lowtide.errors import InvalidConfig, SaslAuthenticationFailed

DEFAULT_RULES = "DEFAULT"  # the same as lowtide.tls.config.DEFAULT_RULES
LOWTIDE_RULES = "RULE:^CN=([^,]+),O=lowtide$/$1/,DEFAULT"
# One rule: DEFAULT, or RULE:pattern/replacement/ with an optional L or U; Kafka's own grammar
# (a pattern or replacement holds no '/'), so rules may contain commas.
_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:([^/]*)/([^/]*)/([LU])?)\s*(?:,|$)")
_GROUP_REF = re.compile(r"\$(\d+)")


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None for DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        match = self.pattern.fullmatch(dn)
        if match is None:
            return None
        name = _GROUP_REF.sub(lambda m: match.group(int(m.group(1))) or "", self.replacement)
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name


class PrincipalMapper:
    """Maps a certificate subject to a principal with ``ssl.principal.mapping.rules``.

    ``principal_of_pem(pem)`` is called per call on a mutual-TLS port, so it caches by the
    certificate's bytes (bounded). Thread-safe.
    """

    def __init__(self, rules: str = DEFAULT_RULES) -> None:
        self.rules_text = rules
        self._rules = parse_rules(rules)
        self._cache: dict[bytes, str] = {}
        self._lock = threading.Lock()

    def name_of(self, dn: str) -> str:
        for rule in self._rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise SaslAuthenticationFailed(f"no ssl.principal.mapping.rules rule matches the certificate subject {dn!r}")

    def principal_of_subject(self, dn: str) -> str:
        return "User:" + self.name_of(dn)

    def principal_of_pem(self, pem: bytes) -> str:
        cached = self._cache.get(pem)
        if cached is not None:
            return cached
        principal = self.principal_of_subject(subject_of(x509.load_pem_x509_certificate(pem)))
        with self._lock:
            if len(self._cache) > 1000:
                self._cache = {}  # bounded: one entry per distinct client certificate
            self._cache[pem] = principal
        return principal

    def principal_of_der(self, der: bytes) -> str:
        return self.principal_of_subject(subject_of(x509.load_der_x509_certificate(der)))


def subject_of(cert: x509.Certificate) -> str:
    """The subject as RFC 2253 writes it (``CN=broker-1,O=lowtide``), as Kafka matches rules on."""
    return cert.subject.rfc4514_string()


def parse_rules(text: str) -> list[_Rule]:
    """Parse ``ssl.principal.mapping.rules``; InvalidConfig naming the bad part."""
    rules: list[_Rule] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _RULE.match(text, pos)
        if match is None or match.end() == pos:
            raise InvalidConfig(f"invalid ssl.principal.mapping.rules at {text[pos:]!r}: expected DEFAULT or "
                                "RULE:<regex>/<replacement>/[L|U]")
        if match.group(1):
            rules.append(_Rule(pattern=None))
        else:
            try:
                pattern = re.compile(match.group(2))
            except re.error as exc:
                raise InvalidConfig(f"invalid regex {match.group(2)!r} in ssl.principal.mapping.rules: {exc}") from None
            rules.append(_Rule(pattern=pattern, replacement=match.group(3), case=match.group(4) or ""))
        pos = match.end()
    if not rules:
        raise InvalidConfig("ssl.principal.mapping.rules is empty")
    return rules
