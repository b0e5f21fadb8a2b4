"""`lowtide consume --share-group` refuses the flags that choose partitions or positions itself
(cli/share_consume.py): a share group's partitions and positions are the group's."""

from __future__ import annotations

import argparse

import pytest

from lowtide.cli.output import CliError
from lowtide.cli.share_consume import check_share_args


def args(**given) -> argparse.Namespace:
    base = {"partition": None, "offset": None, "group": None, "isolation_level": "read_uncommitted"}
    return argparse.Namespace(**{**base, **given})


def test_plain_share_group_flags_pass():
    check_share_args(args())


@pytest.mark.parametrize(("given", "flag"), [
    ({"partition": 0}, "--partition"), ({"offset": "earliest"}, "--offset"), ({"group": "g"}, "--group"),
    ({"isolation_level": "read_committed"}, "--isolation-level read_committed"),
])
def test_a_flag_choosing_partitions_or_positions_is_refused_naming_it(given, flag):
    with pytest.raises(CliError) as raised:
        check_share_args(args(**given))
    assert flag in str(raised.value)
