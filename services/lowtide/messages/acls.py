"""ACL bindings and filters (KIP-11), the data of the ``lowtide.v1.Admin`` ACL calls and of Kafka's
CreateAcls / DescribeAcls / DeleteAcls.

Here, below every package, so the Kafka listener (which may not import ``lowtide.auth``) builds the
same bindings and filters the front door's ``AclAdmin`` takes; ``lowtide.auth.acl`` (the authorizer)
re-exports them. The enums carry the numbers of the ``lowtide.v1`` proto enums and of Kafka's
``AclOperation``/``ResourceType``/``PatternType``/``AclPermissionType``, so conversion is a plain
``Enum(int)``. Construction validates: invalid input raises InvalidRequest with the offending value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from lowtide.errors import InvalidRequest

CLUSTER_RESOURCE_NAME = "kafka-cluster"
WILDCARD_RESOURCE = "*"
PRINCIPAL_TYPE = "User"


class ResourceType(enum.IntEnum):
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5  # Kafka's: a producer's transactional.id (WRITE to use it, KIP-98)


class PatternType(enum.IntEnum):
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    ALL = 2
    READ = 3
    WRITE = 4
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11  # Kafka's AlterConfigs / IncrementalAlterConfigs on a topic


class AclPermission(enum.IntEnum):
    DENY = 2
    ALLOW = 3


def _parse_enum(enum_cls: type[enum.IntEnum], text: str, what: str) -> Any:
    # CLI spellings are lower case with dashes ("cluster-action"); proto/JSON use upper snake case.
    key = text.strip().upper().replace("-", "_")
    try:
        return enum_cls[key]
    except KeyError:
        choices = ", ".join(m.name.lower().replace("_", "-") for m in enum_cls)
        raise InvalidRequest(f"unknown {what} {text!r}; expected one of: {choices}") from None


def parse_operation(text: str) -> AclOperation:
    """``"delete"`` / ``"DELETE"`` / ``"cluster-action"`` -> AclOperation; else InvalidRequest."""
    return _parse_enum(AclOperation, text, "operation")


def parse_resource_type(text: str) -> ResourceType:
    return _parse_enum(ResourceType, text, "resource type")


def parse_pattern_type(text: str) -> PatternType:
    return _parse_enum(PatternType, text, "resource pattern type")


def parse_permission(text: str) -> AclPermission:
    return _parse_enum(AclPermission, text, "permission")


def parse_principal(text: str) -> str:
    """Validate a principal of the form ``User:name`` (``User:*`` = everyone); return it as given."""
    kind, sep, name = text.partition(":")
    if not sep or kind != PRINCIPAL_TYPE or not name or name != name.strip():
        raise InvalidRequest(f"invalid principal {text!r}: expected 'User:<name>', e.g. 'User:alice' or 'User:*'")
    return text


def _coerce(enum_cls: type[enum.IntEnum], value: Any, what: str) -> Any:
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        return _parse_enum(enum_cls, value, what)
    try:
        return enum_cls(value)
    except ValueError:
        raise InvalidRequest(f"invalid {what} {value!r}") from None


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: ``permission`` for ``principal`` to do ``operation`` on a resource pattern.

    Immutable and hashable (safe to share between threads). Construction validates and coerces
    ints/strings to the enums; invalid input raises InvalidRequest with the offending value.
    """

    principal: str
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    operation: AclOperation
    permission: AclPermission

    def __post_init__(self) -> None:
        parse_principal(self.principal)
        rtype = _coerce(ResourceType, self.resource_type, "resource type")
        ptype = _coerce(PatternType, self.pattern_type, "resource pattern type")
        object.__setattr__(self, "resource_type", rtype)
        object.__setattr__(self, "pattern_type", ptype)
        object.__setattr__(self, "operation", _coerce(AclOperation, self.operation, "operation"))
        object.__setattr__(self, "permission", _coerce(AclPermission, self.permission, "permission"))
        if not self.resource_name:
            raise InvalidRequest("resource name must not be empty")
        if rtype is ResourceType.CLUSTER and (
            self.resource_name != CLUSTER_RESOURCE_NAME or ptype is not PatternType.LITERAL
        ):
            raise InvalidRequest(
                f"the only valid CLUSTER resource is the LITERAL name {CLUSTER_RESOURCE_NAME!r}"
            )
        if ptype is PatternType.PREFIXED and self.resource_name == WILDCARD_RESOURCE:
            # Kafka rejects it too: "*" is the literal wildcard; a "*" prefix would match nothing.
            raise InvalidRequest("resource name '*' is only valid with pattern type LITERAL")

    def matches_resource(self, resource_type: ResourceType, resource_name: str) -> bool:
        """Whether this binding's resource pattern covers the concrete resource."""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return resource_name.startswith(self.resource_name)
        return self.resource_name == WILDCARD_RESOURCE or self.resource_name == resource_name

    def as_dict(self) -> dict[str, str]:
        """JSON-ready form with enum names (the CLI's and the store's wire shape)."""
        return {
            "principal": self.principal,
            "resource_type": self.resource_type.name,
            "resource_name": self.resource_name,
            "pattern_type": self.pattern_type.name,
            "operation": self.operation.name,
            "permission": self.permission.name,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> AclBinding:
        try:
            return cls(
                principal=doc["principal"],
                resource_type=doc["resource_type"],
                resource_name=doc["resource_name"],
                pattern_type=doc["pattern_type"],
                operation=doc["operation"],
                permission=doc["permission"],
            )
        except KeyError as exc:
            raise InvalidRequest(f"ACL binding is missing field {exc.args[0]!r}: {doc!r}") from None


@dataclass(frozen=True, slots=True)
class AclFilter:
    """A pattern over bindings for DescribeAcls/DeleteAcls: every ``None`` field matches anything.

    Set fields match exactly (as Kafka's ``AclBindingFilter`` with a concrete pattern type): a
    filter on resource name ``orders`` does not select a PREFIXED ``ord`` binding. Immutable.
    """

    principal: str | None = None
    resource_type: ResourceType | None = None
    resource_name: str | None = None
    pattern_type: PatternType | None = None
    operation: AclOperation | None = None
    permission: AclPermission | None = None

    def __post_init__(self) -> None:
        if self.principal is not None:
            parse_principal(self.principal)
        for field, cls, what in (
            ("resource_type", ResourceType, "resource type"),
            ("pattern_type", PatternType, "resource pattern type"),
            ("operation", AclOperation, "operation"),
            ("permission", AclPermission, "permission"),
        ):
            value = getattr(self, field)
            if value is not None:
                object.__setattr__(self, field, _coerce(cls, value, what))

    def matches(self, binding: AclBinding) -> bool:
        return (
            (self.principal is None or self.principal == binding.principal)
            and (self.resource_type is None or self.resource_type == binding.resource_type)
            and (self.resource_name is None or self.resource_name == binding.resource_name)
            and (self.pattern_type is None or self.pattern_type == binding.pattern_type)
            and (self.operation is None or self.operation == binding.operation)
            and (self.permission is None or self.permission == binding.permission)
        )
