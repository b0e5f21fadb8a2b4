"""Configs over the Kafka protocol: DescribeConfigs, IncrementalAlterConfigs and AlterConfigs.

Topics: DescribeConfigs answers from the front door's Metadata (the topic's config as stored),
each key the topic sets as DYNAMIC_TOPIC_CONFIG and every other key lowtide knows with its default
as DEFAULT_CONFIG, as a Kafka broker does (``kafka-topics --describe`` prints only the non-default
ones; ``--under-min-isr-partitions`` needs min.insync.replicas to be there). Both alter APIs are
the front door's Admin.AlterConfigs: the incremental one op by op, the legacy one with ``replace``
(Kafka's whole-set semantics: keys not given return to their defaults).

Brokers: lowtide's broker settings are static (each replica's flags at start), so DescribeConfigs
for a broker (its id, or "" for the cluster default) lists a fixed set of Kafka broker keys with
lowtide's defaults, read-only, as DEFAULT_CONFIG; altering one is POLICY_VIOLATION naming what to
change instead. Other resource types (loggers, groups, client metrics) are INVALID_REQUEST.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lowtide.kafka.apis_admin import kafka_brokers
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import INVALID_REQUEST, NO_THROTTLE, error_code
from lowtide.metadata.config_defaults import BROKER_SYNONYMS, TOPIC_CONFIG_DEFAULTS, broker_config_defaults
from lowtide_pb import admin_pb2

ALTER_CONFIGS_KEY, DESCRIBE_CONFIGS_KEY, INCREMENTAL_ALTER_CONFIGS_KEY = 33, 32, 44
# Kafka's ConfigResource.Type and ConfigEntry.ConfigSource numbers.
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5
UNKNOWN_TOPIC_OR_PARTITION, POLICY_VIOLATION = 3, 44


# -- DescribeConfigs -------------------------------------------------------------------------
def _entry(call: Call, body: Any, name: str, value: str, source: int, *, read_only: bool,
           synonyms: list[tuple[str, str, int]]) -> Any:
    return call.make(
        "DescribeConfigsResourceResult", name=name, value=value, read_only=read_only, config_source=source,
        is_default=source == DEFAULT_CONFIG, is_sensitive=False, config_type=0, documentation=None,
        synonyms=tuple(call.make("DescribeConfigsSynonym", name=n, value=v, source=s) for n, v, s in synonyms)
        if getattr(body, "include_synonyms", False) else ())


def _topic_entries(call: Call, body: Any, config: Mapping[str, str], keys: set[str] | None) -> tuple:
    out = []
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


def describe_configs(call: Call, body: Any) -> Any:
    """Topic and broker configs (module doc); per-resource errors, in request order."""
    names = [r.resource_name for r in body.resources if r.resource_type == RESOURCE_TOPIC]
    meta = call.admin("Metadata", admin_pb2.MetadataRequest(topics=names or ["\0none"]))
    topics = {t.name: t for t in meta.topics} if names else {}
    brokers = kafka_brokers(meta)
    results = []
    for r in body.resources:
        code, message, configs = 0, None, ()
        keys = None if r.configuration_keys is None else set(r.configuration_keys)  # null = every key
        if r.resource_type == RESOURCE_TOPIC:
            t = topics.get(r.resource_name)
            if t is None or t.error_code:
                code = t.error_code if t is not None else UNKNOWN_TOPIC_OR_PARTITION
                message = (t.error_message or None) if t is not None else None
            else:
                configs = _topic_entries(call, body, t.config, keys)
        elif r.resource_type == RESOURCE_BROKER:
            known = {str(b.id) for b in brokers}
            if r.resource_name and r.resource_name not in known:
                code, message = INVALID_REQUEST, (f"unknown broker id {r.resource_name!r} (brokers: "
                                                  f"{', '.join(sorted(known)) or 'none'}; '' = cluster default)")
            else:
                configs = tuple(_entry(call, body, k, v, DEFAULT_CONFIG, read_only=True,
                                       synonyms=[(k, v, DEFAULT_CONFIG)])
                                for k, v in sorted(broker_config_defaults(live_brokers=len(brokers)).items())
                                if keys is None or k in keys)
        else:
            code, message = INVALID_REQUEST, (f"lowtide describes topic (2) and broker (4) configs, not resource "
                                              f"type {r.resource_type}")
        results.append(call.make("DescribeConfigsResult", error_code=error_code(code), error_message=message,
                                 resource_type=r.resource_type, resource_name=r.resource_name, configs=configs))
    return call.make(call.response, throttle_time=NO_THROTTLE, results=tuple(results))


# -- IncrementalAlterConfigs / AlterConfigs --------------------------------------------------
def _refusal(resource_type: int) -> tuple[int, str]:
    if resource_type == RESOURCE_BROKER:
        return POLICY_VIOLATION, ("lowtide's broker configs are static (each replica's --config flags at start) "
                                  "and cannot be altered; alter the topic's config instead")
    return INVALID_REQUEST, f"lowtide alters topic (2) configs only, not resource type {resource_type}"


def _alter(call: Call, body: Any, *, replace: bool) -> Any:
    request = admin_pb2.AlterConfigsRequest(validate_only=bool(body.validate_only))
    for r in body.resources:
        if r.resource_type != RESOURCE_TOPIC:
            continue
        resource = request.resources.add(topic=r.resource_name, replace=replace)
        for c in r.configs:
            op = resource.ops.add(key=c.name, op=admin_pb2.CONFIG_SET if replace else c.config_operation)
            if c.value is not None:
                op.value = c.value
    answers = iter(call.admin("AlterConfigs", request).results if request.resources else ())
    responses = []
    for r in body.resources:
        if r.resource_type == RESOURCE_TOPIC:
            a = next(answers)  # one result per topic resource, in order
            code, message = a.error_code, a.error_message or None
        else:
            code, message = _refusal(r.resource_type)
        responses.append(call.make("AlterConfigsResourceResponse", error_code=error_code(code),
                                   error_message=message if code else None, resource_type=r.resource_type,
                                   resource_name=r.resource_name))
    return call.make(call.response, throttle_time=NO_THROTTLE, responses=tuple(responses))


def incremental_alter_configs(call: Call, body: Any) -> Any:
    """Kafka's SET/DELETE/APPEND/SUBTRACT ops on topic configs (module doc)."""
    return _alter(call, body, replace=False)


def alter_configs(call: Call, body: Any) -> Any:
    """The legacy whole-set AlterConfigs: the given entries become the topic's config."""
    return _alter(call, body, replace=True)


APIS = [
    Api(DESCRIBE_CONFIGS_KEY, "DescribeConfigs", 1, 4, describe_configs),
    Api(ALTER_CONFIGS_KEY, "AlterConfigs", 0, 2, alter_configs),
    Api(INCREMENTAL_ALTER_CONFIGS_KEY, "IncrementalAlterConfigs", 0, 1, incremental_alter_configs),
]
