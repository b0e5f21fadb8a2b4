"""Changing topic configs after creation: the domain behind Admin.AlterConfigs (Kafka's
IncrementalAlterConfigs and AlterConfigs reach it too).

Per topic, in request order, with Kafka's answers:

* the caller needs ALTER_CONFIGS on the topic, checked before existence (a refused caller cannot
  probe which names exist): TOPIC_AUTHORIZATION_FAILED;
* a topic named twice in one request: INVALID_REQUEST for each of its entries (Kafka's "duplicate
  resources"), since which one should win is a guess;
* unknown topic: UNKNOWN_TOPIC_OR_PARTITION;
* the ops are applied as ``topic_config.apply_config_ops`` says (INVALID_REQUEST / INVALID_CONFIG,
  nothing changed for that topic); a min.insync.replicas above the replication factor is
  INVALID_CONFIG, as at creation; a diskless topic refuses keys it does not act on.

The new config is written with a compare-and-set on the topic record, which bumps the metadata
version and publishes it (``MetadataStore.update_topic_config``): every replica's reconcile loop
then hands its hosted partitions the new config, so retention, cleanup policy and the cleaner
follow without a restart (``replica/reconcile.py``). Diskless topics' settings are read from the
metadata by their coordinator shard on each retention pass.

Broker resources (Kafka's ConfigResource type BROKER) travel in the same call, named
``broker:<id>`` or ``broker:`` for the cluster-wide default (``config_defaults.broker_resource``).
Only the KIP-73 throttle rates are dynamic (``DYNAMIC_BROKER_CONFIGS``, bytes/s, SET or DELETE);
DELETE of ``replica.alter.log.dirs.io.max.bytes.per.second`` is accepted and does nothing (Kafka's
reassignment tool clears it on --verify); any other broker key is POLICY_VIOLATION (lowtide's
broker settings are static flags). They need ALTER_CONFIGS on the CLUSTER
(CLUSTER_AUTHORIZATION_FAILED); a validate_only resource with no ops, which only reads the
current config back (how the Kafka listener's DescribeConfigs learns the dynamic values), needs
DESCRIBE_CONFIGS. An id no broker ever registered with is INVALID_REQUEST. Written with a
compare-and-set (``MetadataStore.update_broker_config``), which publishes a metadata event: each
replica's quota watcher then re-reads its rates (``replica/quota.py``).

Group resources (Kafka's type GROUP, ``kafka-configs --entity-type groups``) are named
``group:<id>`` (``messages.group_configs.group_resource``): the keys of Kafka's GroupConfig that
``messages.group_configs`` lists, SET or DELETE, stored per group in the metadata. They need ALTER_CONFIGS
on the GROUP (a validate_only read-back with no ops: DESCRIBE_CONFIGS), else
GROUP_AUTHORIZATION_FAILED; the group need not exist (Kafka's tools set a share group's
``share.auto.offset.reset`` before its first member joins).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from lowtide.auth.acl import AclOperation, Authorizer, ResourceType
from lowtide.errors import (
    ClusterAuthorizationFailed,
    GroupAuthorizationFailed,
    InvalidConfig,
    InvalidRequest,
    LowtideError,
    PolicyViolation,
    TopicAuthorizationFailed,
)
from lowtide.frontdoor.admin.topic_config import (
    apply_config_ops,
    check_diskless_config_change,
    drop_unchanged_diskless_enable,
)
from lowtide.messages.admin import ConfigChange, ConfigOp, ConfigOpType, ConfigOutcome
from lowtide.messages.group_configs import parse_group_resource
from lowtide.metadata.config_defaults import ALTER_LOG_DIRS_RATE, DYNAMIC_BROKER_CONFIGS, parse_broker_resource
from lowtide.metadata.group_configs import GroupConfigs
from lowtide.metadata.model import TopicInfo
from lowtide.metadata.store import MetadataStore


def _new_config(topic: TopicInfo, change: ConfigChange) -> dict[str, str]:
    ops = drop_unchanged_diskless_enable(change.ops, diskless=topic.diskless, topic=topic.name,
                                         shards=topic.diskless_shards)
    config = apply_config_ops(topic.config, ops, replace=change.replace)
    if topic.diskless:
        check_diskless_config_change(topic.config, config)
    else:
        min_isr = int(config.get("min.insync.replicas", "1"))
        if min_isr > topic.replication_factor:
            raise InvalidConfig(f"min.insync.replicas={min_isr} is larger than the replication factor "
                                f"{topic.replication_factor} of '{topic.name}'")
    return config


def apply_broker_config_ops(current: dict[str, str], ops: Sequence[ConfigOp], *,
                            replace: bool = False) -> dict[str, str]:
    """A broker's dynamic configs after ``ops`` (module doc), or raises and changes nothing.

    SET needs a whole number of bytes/s >= 0; DELETE returns a key to unlimited; ``replace`` (the
    legacy AlterConfigs) makes the SET ops the whole set. APPEND/SUBTRACT: INVALID_CONFIG (no
    broker key is a list); a key given twice or a missing value: INVALID_REQUEST."""
    config: dict[str, str] = {} if replace else dict(current)
    seen: set[str] = set()
    for o in ops:
        if o.key in seen:
            raise InvalidRequest(f"config '{o.key}' is given more than once")
        seen.add(o.key)
        try:
            kind = ConfigOpType(o.op)
        except ValueError:
            raise InvalidRequest(f"config '{o.key}': unknown operation {o.op}") from None
        if replace and kind is not ConfigOpType.SET:
            raise InvalidRequest(f"config '{o.key}': AlterConfigs replaces the whole config; use "
                                 f"IncrementalAlterConfigs for {kind.name}")
        if o.key == ALTER_LOG_DIRS_RATE and kind is ConfigOpType.DELETE:
            continue  # one data directory per broker: nothing to throttle, nothing to clear
        if o.key not in DYNAMIC_BROKER_CONFIGS:
            raise PolicyViolation(f"broker config '{o.key}' is static in lowtide (each replica's --config flags at "
                                  f"start) and cannot be altered; the dynamic broker configs are "
                                  f"{', '.join(sorted(DYNAMIC_BROKER_CONFIGS))}")
        if kind is ConfigOpType.DELETE:
            config.pop(o.key, None)
            continue
        if kind is not ConfigOpType.SET:
            raise InvalidConfig(f"{kind.name} applies to list configs only, not broker config '{o.key}'")
        if o.value is None:
            raise InvalidRequest(f"config '{o.key}': SET needs a value")
        value = o.value.strip()
        if not value.isdigit():
            raise InvalidConfig(f"invalid value {o.value!r} for broker config '{o.key}': must be a whole number "
                                "of bytes per second >= 0")
        config[o.key] = str(int(value))
    return config


class TopicConfigAdmin:
    """Alters topic configs (module doc). Thread-safe: stateless apart from its thread-safe
    collaborators; concurrent changes to one topic are serialised by the store's compare-and-set."""

    def __init__(self, *, store: MetadataStore, authorizer: Authorizer) -> None:
        self._store = store
        self._authorizer = authorizer
        self._groups = GroupConfigs(store)

    def alter_configs(self, *, principal: str, changes: Sequence[ConfigChange],
                      validate_only: bool = False) -> list[ConfigOutcome]:
        """One outcome per change, in order; a failed change leaves its topic as it was."""
        named = Counter(c.topic for c in changes)
        outcomes = []
        for change in changes:
            try:
                broker = parse_broker_resource(change.topic)
                if broker is not None:
                    outcomes.append(self._alter_broker(principal, change, broker, validate_only=validate_only,
                                                       duplicate=named[change.topic] > 1))
                    continue
                group = parse_group_resource(change.topic)
                if group is not None:
                    outcomes.append(self._alter_group(principal, change, group, validate_only=validate_only,
                                                      duplicate=named[change.topic] > 1))
                    continue
                outcomes.append(self._alter(principal, change, validate_only=validate_only,
                                            duplicate=named[change.topic] > 1))
            except LowtideError as err:
                outcomes.append(ConfigOutcome(topic=change.topic, error=err))
        return outcomes

    def _alter(self, principal: str, change: ConfigChange, *, validate_only: bool,
               duplicate: bool) -> ConfigOutcome:
        if not self._authorizer.authorize(principal=principal, operation=AclOperation.ALTER_CONFIGS,
                                          resource_type=ResourceType.TOPIC, resource_name=change.topic):
            raise TopicAuthorizationFailed(f"{principal} is not authorized to ALTER_CONFIGS on TOPIC "
                                           f"{change.topic!r}")
        if duplicate:
            raise InvalidRequest(f"topic '{change.topic}' is named more than once in one request")
        written = self._store.update_topic_config(change.topic, lambda topic: _new_config(topic, change),
                                                  dry_run=validate_only)
        return ConfigOutcome(topic=change.topic, config=dict(written.config))

    def _alter_broker(self, principal: str, change: ConfigChange, broker: str, *, validate_only: bool,
                      duplicate: bool) -> ConfigOutcome:
        reading = validate_only and not change.ops and not change.replace
        operation = AclOperation.DESCRIBE_CONFIGS if reading else AclOperation.ALTER_CONFIGS
        if not self._authorizer.authorize_cluster(principal=principal, operation=operation):
            raise ClusterAuthorizationFailed(f"{principal} is not authorized to {operation.name} on the CLUSTER")
        if duplicate:
            raise InvalidRequest(f"broker resource {broker or '<default>'} is named more than once in one request")
        if broker and (not broker.isdigit() or int(broker) not in self._store.brokers()):
            raise InvalidRequest(f"unknown broker id {broker!r} ('' = the cluster-wide default)")
        broker = str(int(broker)) if broker else ""  # "01" is broker 1
        written = self._store.update_broker_config(
            broker, lambda current: apply_broker_config_ops(current, change.ops, replace=change.replace),
            dry_run=validate_only)
        return ConfigOutcome(topic=change.topic, config=written)

    def _alter_group(self, principal: str, change: ConfigChange, group: str, *, validate_only: bool,
                     duplicate: bool) -> ConfigOutcome:
        reading = validate_only and not change.ops and not change.replace
        operation = AclOperation.DESCRIBE_CONFIGS if reading else AclOperation.ALTER_CONFIGS
        if not self._authorizer.authorize(principal=principal, operation=operation,
                                          resource_type=ResourceType.GROUP, resource_name=group):
            raise GroupAuthorizationFailed(f"{principal} is not authorized to {operation.name} on GROUP {group!r}")
        if duplicate:
            raise InvalidRequest(f"group '{group}' is named more than once in one request")
        written = self._groups.update(group, change.ops, replace=change.replace, dry_run=validate_only)
        return ConfigOutcome(topic=change.topic, config=written)
