"""``lowtide consume``'s text output by columns (cli/data_cmd.py ``columns_to_text``): the same
lines as ``escape_bytes`` of each record, whether the fast path (text data, cut from the buffers)
or the escaping path (nulls, binary bytes) makes them."""

from __future__ import annotations

import pytest

from lowtide.cli.data_cmd import columns_to_text, escape_bytes
from lowtide.record.batch import encode_batch
from lowtide.record.columns import columnize, head


def columns_of(values, keys=None):
    data = encode_batch(values, keys=keys or [None] * len(values), base_offset=0)
    return columnize(data, min_offset=0, max_offset=1 << 40, with_headers=False)


def expected(values, keys=None, *, print_key=False) -> str:
    keys = keys or [None] * len(values)
    return "".join((f"{escape_bytes(k)}\t" if print_key else "") + escape_bytes(v) + "\n"
                   for k, v in zip(keys, values, strict=True))


def test_text_values_are_cut_from_the_buffer_as_bytes_with_the_lines_escape_bytes_prints():
    values = [b"hello", b"", b"a b ~ {x}", b"A" * 1024]
    out = columns_to_text(columns_of(values), print_key=False)
    assert out == expected(values).encode()


def test_text_keys_and_values_print_key_tab_value_from_the_buffers():
    values, keys = [b"v1", b"v2", b""], [b"k1", b"", b"k3"]
    out = columns_to_text(columns_of(values, keys), print_key=True)
    assert out == b"k1\tv1\n\tv2\nk3\t\n" == expected(values, keys, print_key=True).encode()


@pytest.mark.parametrize("values", [
    [b"plain", b"new\nline"],          # a newline inside a value
    [b"back\\slash", b"x"],            # the backslash is always escaped
    [b"\x00\xff", b"caf\xc3\xa9"],     # binary and non-ASCII UTF-8
    [b"x", None],                      # a null value prints null
])
def test_values_that_need_escaping_or_are_null_take_the_escaping_path(values):
    out = columns_to_text(columns_of(values), print_key=False)
    assert isinstance(out, str) and out == expected(values)


def test_a_null_key_prints_null_before_the_tab():
    values, keys = [b"v1", b"v2"], [None, b"k2"]
    assert columns_to_text(columns_of(values, keys), print_key=True) == "null\tv1\nk2\tv2\n"


def test_only_the_rows_a_head_keeps_are_printed():
    cols = head(columns_of([b"a", b"b", b"c"]), 2)
    assert columns_to_text(cols, print_key=False) == b"a\nb\n"
