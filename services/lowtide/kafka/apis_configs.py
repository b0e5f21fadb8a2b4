"""Configs over the Kafka protocol: DescribeConfigs, IncrementalAlterConfigs and AlterConfigs.

Topics: DescribeConfigs answers from the front door's Metadata (the topic's config as stored),
each key the topic sets as DYNAMIC_TOPIC_CONFIG and every other key lowtide knows with its default
as DEFAULT_CONFIG, as a Kafka broker does (``kafka-topics --describe`` prints only the non-default
ones; ``--under-min-isr-partitions`` needs min.insync.replicas to be there). Both alter APIs are
the front door's TopicConfigAdmin (``Call.front.configs``, Admin.AlterConfigs over gRPC): the
incremental one op by op, the legacy one with ``replace``
(Kafka's whole-set semantics: keys not given return to their defaults).

Brokers: lowtide's broker settings are static (each replica's flags at start), except the KIP-73
replication throttle rates (``leader.replication.throttled.rate``,
``follower.replication.throttled.rate``), which are dynamic per broker id or cluster-wide (resource
name "" = the default). DescribeConfigs for a broker lists a fixed set of Kafka broker keys with
lowtide's defaults, read-only, as DEFAULT_CONFIG, plus the throttle keys: DYNAMIC_BROKER_CONFIG
when set on that broker, DYNAMIC_DEFAULT_BROKER_CONFIG when set cluster-wide, else DEFAULT_CONFIG
(unlimited, Kafka's Long.MAX_VALUE); it needs DESCRIBE_CONFIGS on the CLUSTER. Both alter APIs
accept SET/DELETE of the throttle rates, and DELETE of
``replica.alter.log.dirs.io.max.bytes.per.second`` as a no-op (``kafka-reassign-partitions
--verify`` clears all three), through the front door's Admin.AlterConfigs with the resource named
``broker:<id>`` (``frontdoor/admin/config_admin.py``: ALTER_CONFIGS on the CLUSTER); any other broker
key is POLICY_VIOLATION naming what to change instead.

Groups (Kafka 4's GROUP resource, ``kafka-configs --entity-type groups``; Kafka's share consumer
tools set ``share.auto.offset.reset`` this way): the keys of ``messages.group_configs``, SET/DELETE, through
the same front door call with the resource named ``group:<id>`` (ALTER_CONFIGS on the GROUP).
DescribeConfigs (DESCRIBE_CONFIGS on the GROUP) lists every group key: GROUP_CONFIG when the group
sets it, else DEFAULT_CONFIG with the built-in default. Other resource types (loggers, client
metrics) are INVALID_REQUEST.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lowtide.errors import InvalidRequest
from lowtide.kafka.apis_admin import describe, kafka_brokers
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import INVALID_REQUEST, NO_THROTTLE, error_code
from lowtide.messages.admin import NO_TOPIC, ConfigChange, ConfigOp, ConfigOpType, ConfigOutcome
from lowtide.messages.group_configs import GROUP_CONFIG_KEYS, group_resource
from lowtide.metadata.config_defaults import (
    BROKER_SYNONYMS,
    DISKLESS_ENABLE,
    DISKLESS_SHARDS,
    DYNAMIC_BROKER_CONFIG_DEFAULTS,
    TOPIC_CONFIG_DEFAULTS,
    broker_config_defaults,
    broker_resource,
    format_diskless_shards,
)

ALTER_CONFIGS_KEY, DESCRIBE_CONFIGS_KEY, INCREMENTAL_ALTER_CONFIGS_KEY = 33, 32, 44
# Kafka's ConfigResource.Type and ConfigEntry.ConfigSource numbers.
RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_GROUP = 2, 4, 32
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, DEFAULT_CONFIG = 1, 2, 3, 5
GROUP_CONFIG = 8
ALTERABLE = (RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_GROUP)
UNKNOWN_TOPIC_OR_PARTITION = 3


# -- DescribeConfigs -------------------------------------------------------------------------
def _entry(call: Call, body: Any, name: str, value: str, source: int, *, read_only: bool,
           synonyms: list[tuple[str, str, int]]) -> Any:
    return call.make(
        "DescribeConfigsResourceResult", name=name, value=value, read_only=read_only, config_source=source,
        is_default=source == DEFAULT_CONFIG, is_sensitive=False, config_type=0, documentation=None,
        synonyms=tuple(call.make("DescribeConfigsSynonym", name=n, value=v, source=s) for n, v, s in synonyms)
        if getattr(body, "include_synonyms", False) else ())


def _topic_entries(call: Call, body: Any, config: Mapping[str, str], keys: set[str] | None, *,
                   diskless: bool, shards: tuple[int, ...] = ()) -> tuple:
    out = []
    if keys is None or DISKLESS_ENABLE in keys:
        # From the topic's record, not its config (topic_config.DISKLESS_ENABLE); fixed at creation.
        out.append(_entry(call, body, DISKLESS_ENABLE, "true" if diskless else "false",
                          DYNAMIC_TOPIC_CONFIG if diskless else DEFAULT_CONFIG, read_only=True,
                          synonyms=[(DISKLESS_ENABLE, "true", DYNAMIC_TOPIC_CONFIG)] if diskless else []))
    if diskless and (keys is None or DISKLESS_SHARDS in keys):
        # Each partition's coordinator shard, from the topic's record: a topic source (not a
        # default) so that kafka-topics --describe lists it among the topic's configs.
        value = format_diskless_shards(shards)
        out.append(_entry(call, body, DISKLESS_SHARDS, value, DYNAMIC_TOPIC_CONFIG, read_only=True,
                          synonyms=[(DISKLESS_SHARDS, value, DYNAMIC_TOPIC_CONFIG)]))
    for name in sorted(set(config) | set(TOPIC_CONFIG_DEFAULTS)):
        if keys is not None and name not in keys:
            continue
        default = TOPIC_CONFIG_DEFAULTS.get(name)
        inherited = [(BROKER_SYNONYMS.get(name, name), default, DEFAULT_CONFIG)] if default is not None else []
        if name in config:
            out.append(_entry(call, body, name, config[name], DYNAMIC_TOPIC_CONFIG, read_only=False,
                              synonyms=[(name, config[name], DYNAMIC_TOPIC_CONFIG), *inherited]))
        else:
            out.append(_entry(call, body, name, default, DEFAULT_CONFIG, read_only=False, synonyms=inherited))
    return tuple(out)


def _broker_entries(call: Call, body: Any, *, own: Mapping[str, str], default: Mapping[str, str],
                    is_default: bool, live_brokers: int, keys: set[str] | None) -> tuple:
    """A broker's (or with ``is_default`` the cluster default's) entries: the static keys, then
    the dynamic ones with the source of their value and Kafka's synonym order (broker, default,
    built-in)."""
    out = [_entry(call, body, k, v, DEFAULT_CONFIG, read_only=True, synonyms=[(k, v, DEFAULT_CONFIG)])
           for k, v in sorted(broker_config_defaults(live_brokers=live_brokers).items())
           if keys is None or k in keys]
    for k, builtin in sorted(DYNAMIC_BROKER_CONFIG_DEFAULTS.items()):
        if keys is not None and k not in keys:
            continue
        layers = [] if is_default or k not in own else [(k, own[k], DYNAMIC_BROKER_CONFIG)]
        if k in default:
            layers.append((k, default[k], DYNAMIC_DEFAULT_BROKER_CONFIG))
        layers.append((k, builtin, DEFAULT_CONFIG))
        _, value, source = layers[0]
        out.append(_entry(call, body, k, value, source, read_only=False, synonyms=layers))
    return tuple(out)


def _alter_configs(call: Call, changes: list[ConfigChange], *, validate_only: bool) -> list[ConfigOutcome]:
    """The front door's TopicConfigAdmin (one outcome per change, in order); a front door that
    runs none refuses the call as its Admin service does."""
    configs = call.front.configs
    if configs is None:
        raise InvalidRequest("this front door does not alter configs")
    return configs.alter_configs(principal=call.principal(), changes=changes, validate_only=validate_only)


def _outcome(outcome: ConfigOutcome) -> tuple[int, str | None]:
    return (0, None) if outcome.error is None else (outcome.error.code, outcome.error.message)


def _dynamic_broker_configs(call: Call, names: set[str]) -> dict[str, tuple[int, str | None, dict[str, str]]]:
    """Broker name ("" = default) -> (error code, message, its dynamic configs), read back from
    the front door (AlterConfigs, validate_only with no ops: DESCRIBE_CONFIGS on the CLUSTER)."""
    ordered = sorted(names | {""})
    answers = _alter_configs(call, [ConfigChange(topic=broker_resource(n), ops=()) for n in ordered],
                             validate_only=True)
    return {n: (*_outcome(a), dict(a.config)) for n, a in zip(ordered, answers, strict=True)}


def _group_entries(call: Call, body: Any, own: Mapping[str, str], keys: set[str] | None) -> tuple:
    out = []
    for name, spec in GROUP_CONFIG_KEYS.items():
        if keys is not None and name not in keys:
            continue
        layers = ([(name, own[name], GROUP_CONFIG)] if name in own else []) + [(name, spec.default, DEFAULT_CONFIG)]
        _, value, source = layers[0]
        out.append(_entry(call, body, name, value, source, read_only=False, synonyms=layers))
    return tuple(out)


def _group_configs(call: Call, groups: list[str]) -> dict[str, tuple[int, str | None, dict[str, str]]]:
    """Group -> (error code, message, its configs), read back from the front door (validate_only,
    no ops: DESCRIBE_CONFIGS on the GROUP)."""
    answers = _alter_configs(call, [ConfigChange(topic=group_resource(g), ops=()) for g in groups],
                             validate_only=True)
    return {g: (*_outcome(a), dict(a.config)) for g, a in zip(groups, answers, strict=True)}


def describe_configs(call: Call, body: Any) -> Any:
    """Topic, broker and group configs (module doc); per-resource errors, in request order."""
    names = [r.resource_name for r in body.resources if r.resource_type == RESOURCE_TOPIC]
    meta = describe(call, names or [NO_TOPIC])
    topics = {t.name: t for t in meta.topics} if names else {}
    brokers = kafka_brokers(meta)
    known = {str(b.id) for b in brokers}
    wanted = {r.resource_name for r in body.resources if r.resource_type == RESOURCE_BROKER
              and (not r.resource_name or r.resource_name in known)}
    dynamic = _dynamic_broker_configs(call, wanted) if wanted else {}
    group_names = sorted({r.resource_name for r in body.resources if r.resource_type == RESOURCE_GROUP})
    groups = _group_configs(call, group_names) if group_names else {}
    results = []
    for r in body.resources:
        code, message, configs = 0, None, ()
        keys = None if r.configuration_keys is None else set(r.configuration_keys)  # null = every key
        if r.resource_type == RESOURCE_TOPIC:
            t = topics.get(r.resource_name)
            if t is None or t.error is not None:
                code = t.error.code if t is not None else UNKNOWN_TOPIC_OR_PARTITION
                message = t.error.message if t is not None else None
            else:
                configs = _topic_entries(call, body, t.config, keys, diskless=t.diskless, shards=t.diskless_shards)
        elif r.resource_type == RESOURCE_BROKER:
            if r.resource_name and r.resource_name not in known:
                code, message = INVALID_REQUEST, (f"unknown broker id {r.resource_name!r} (brokers: "
                                                  f"{', '.join(sorted(known)) or 'none'}; '' = cluster default)")
            else:
                own_code, own_message, own = dynamic[r.resource_name]
                default_code, default_message, default = dynamic[""]
                code, message = (own_code, own_message) if own_code else (default_code, default_message)
                if not code:
                    configs = _broker_entries(call, body, own=own, default=default, is_default=not r.resource_name,
                                              live_brokers=len(brokers), keys=keys)
        elif r.resource_type == RESOURCE_GROUP:
            code, message, own = groups[r.resource_name]
            if not code:
                configs = _group_entries(call, body, own, keys)
        else:
            code, message = INVALID_REQUEST, (f"lowtide describes topic (2), broker (4) and group (32) configs, "
                                              f"not resource type {r.resource_type}")
        results.append(call.make("DescribeConfigsResult", error_code=error_code(code), error_message=message,
                                 resource_type=r.resource_type, resource_name=r.resource_name, configs=configs))
    return call.make(call.response, throttle_time=NO_THROTTLE, results=tuple(results))


# -- IncrementalAlterConfigs / AlterConfigs --------------------------------------------------
def _refusal(resource_type: int) -> tuple[int, str]:
    return INVALID_REQUEST, (f"lowtide alters topic (2), broker (4) and group (32) configs only, not resource type "
                             f"{resource_type}")


def _alter(call: Call, body: Any, *, replace: bool) -> Any:
    changes = []
    for r in body.resources:
        if r.resource_type not in ALTERABLE:
            continue
        name = (r.resource_name if r.resource_type == RESOURCE_TOPIC else broker_resource(r.resource_name)
                if r.resource_type == RESOURCE_BROKER else group_resource(r.resource_name))
        # The op as the client sent it: one that is no ConfigOpType is refused per resource.
        changes.append(ConfigChange(topic=name, replace=replace, ops=tuple(
            ConfigOp(key=c.name, op=ConfigOpType.SET if replace else int(c.config_operation), value=c.value)
            for c in r.configs)))
    answers = iter(_alter_configs(call, changes, validate_only=bool(body.validate_only)) if changes else ())
    responses = []
    for r in body.resources:
        if r.resource_type in ALTERABLE:
            code, message = _outcome(next(answers))  # one result per topic, broker or group resource, in order
        else:
            code, message = _refusal(r.resource_type)
        responses.append(call.make("AlterConfigsResourceResponse", error_code=error_code(code),
                                   error_message=message if code else None, resource_type=r.resource_type,
                                   resource_name=r.resource_name))
    return call.make(call.response, throttle_time=NO_THROTTLE, responses=tuple(responses))


def incremental_alter_configs(call: Call, body: Any) -> Any:
    """Kafka's SET/DELETE/APPEND/SUBTRACT ops on topic configs, SET/DELETE on the dynamic broker
    configs (module doc)."""
    return _alter(call, body, replace=False)


def alter_configs(call: Call, body: Any) -> Any:
    """The legacy whole-set AlterConfigs: the given entries become the topic's (or the broker's
    dynamic) config."""
    return _alter(call, body, replace=True)


APIS = [
    Api(DESCRIBE_CONFIGS_KEY, "DescribeConfigs", 1, 4, describe_configs),
    Api(ALTER_CONFIGS_KEY, "AlterConfigs", 0, 2, alter_configs),
    Api(INCREMENTAL_ALTER_CONFIGS_KEY, "IncrementalAlterConfigs", 0, 1, incremental_alter_configs),
]
