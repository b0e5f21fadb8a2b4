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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from lowtide.auth.acl import AclOperation, Authorizer, ResourceType
from lowtide.errors import InvalidConfig, InvalidRequest, LowtideError, TopicAuthorizationFailed
from lowtide.frontdoor.topic_config import apply_config_ops, check_diskless_config_change
from lowtide.messages.admin import ConfigChange, ConfigOutcome
from lowtide.metadata.model import TopicInfo
from lowtide.metadata.store import MetadataStore


def _new_config(topic: TopicInfo, change: ConfigChange) -> dict[str, str]:
    config = apply_config_ops(topic.config, change.ops, replace=change.replace)
    if topic.diskless:
        check_diskless_config_change(topic.config, config)
    else:
        min_isr = int(config.get("min.insync.replicas", "1"))
        if min_isr > topic.replication_factor:
            raise InvalidConfig(f"min.insync.replicas={min_isr} is larger than the replication factor "
                                f"{topic.replication_factor} of '{topic.name}'")
    return config


class TopicConfigAdmin:
    """Alters topic configs (module doc). Thread-safe: stateless apart from its thread-safe
    collaborators; concurrent changes to one topic are serialised by the store's compare-and-set."""

    def __init__(self, *, store: MetadataStore, authorizer: Authorizer) -> None:
        self._store = store
        self._authorizer = authorizer

    def alter_configs(self, *, principal: str, changes: Sequence[ConfigChange],
                      validate_only: bool = False) -> list[ConfigOutcome]:
        """One outcome per change, in order; a failed change leaves its topic as it was."""
        named = Counter(c.topic for c in changes)
        outcomes = []
        for change in changes:
            try:
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
