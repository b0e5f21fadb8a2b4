"""Group configs in the cluster metadata (etcd): one record per group with any config set::

    group_configs/{group id}    JSON object {key: value}, keys sorted; absent: every key default

written with a compare-and-set (a change is acknowledged once etcd committed it) and read from the
process's metadata image. The keys and their checks are ``messages/group_configs.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from lowtide.errors import InvalidRequest, RequestTimedOut
from lowtide.messages.admin import ConfigOp
from lowtide.messages.group_configs import GROUP_CONFIG_KEYS, apply_group_config_ops
from lowtide.metadata.sections import section
from lowtide.metadata.store import MetadataStore

SECTION = "group_configs"


class GroupConfigs:
    """The group configs in the cluster metadata (module doc).

    Thread-safety: thread-safe (reads from the metadata image; writes are etcd compare-and-sets,
    retried when another writer got in between).
    """

    def __init__(self, store: MetadataStore) -> None:
        self._section = section(store, SECTION)

    def of(self, group_id: str) -> dict[str, str]:
        """The keys set on ``group_id`` ({} for none: every key is its default)."""
        entry = self._section.get(group_id)
        return dict(json.loads(entry.value)) if entry is not None else {}

    def value(self, group_id: str, key: str, default: str | None = None) -> str:
        """One key of ``group_id``: as set, else ``default`` (a process's own default, e.g. a
        replica flag), else the key's built-in default."""
        got = self.of(group_id).get(key)
        if got is not None:
            return got
        return default if default is not None else GROUP_CONFIG_KEYS[key].default

    def update(self, group_id: str, ops: Sequence[ConfigOp], *, replace: bool = False,
               dry_run: bool = False) -> dict[str, str]:
        """Apply ``ops`` to ``group_id``'s configs; returns them as written (or as they would be,
        ``dry_run``). An empty result removes the record."""
        if not group_id:
            raise InvalidRequest("a group config needs a group id")
        for _ in range(20):
            entry = self._section.get(group_id)
            current = dict(json.loads(entry.value)) if entry is not None else {}
            updated = apply_group_config_ops(current, ops, replace=replace)
            if dry_run or updated == current:
                return updated
            value = json.dumps(updated, sort_keys=True).encode() if updated else None
            if self._section.change({group_id: value}, expect={group_id: entry}):
                return updated
        raise RequestTimedOut(f"group config of {group_id!r}: changed under too many concurrent writers; retry")
