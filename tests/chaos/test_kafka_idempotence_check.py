"""The value check of tests/chaos/kafka_idempotence.py, on made-up histories: it finds a value stored
twice, an acknowledged value missing, and an acknowledged offset holding another value."""

from __future__ import annotations

from tests.chaos.kafka_idempotence import check_values


def test_a_clean_history_passes():
    check = check_values("1", {"1.0": (0, 0), "1.1": (1, 0)}, {0: [(0, "1.0"), (1, "1.2")], 1: [(0, "1.1")]})
    assert check.ok and check.acked == 2 and check.stored == 3  # 1.2: its send failed, stored once: fine


def test_a_retry_appended_again_is_a_duplicate_whether_or_not_it_was_acknowledged():
    final = {0: [(0, "1.0"), (1, "1.1"), (2, "1.0"), (3, "1.1"), (4, "1.2"), (5, "1.2")]}
    check = check_values("1", {"1.0": (0, 2), "1.1": (0, 3)}, final)
    assert check.duplicated == {"1.0": [(0, 0), (0, 2)], "1.1": [(0, 1), (0, 3)], "1.2": [(0, 4), (0, 5)]}
    assert check.extra_copies == 3 and not check.lost and not check.misplaced and not check.ok


def test_a_lost_value_and_a_misplaced_one():
    check = check_values("2", {"2.0": (0, 0), "2.1": (0, 1), "2.2": (1, 0)}, {0: [(0, "2.1"), (1, "2.0")], 1: []})
    assert check.lost == ["2.2"]
    assert check.misplaced == [("2.0", 0, 0, "2.1"), ("2.1", 0, 1, "2.0"), ("2.2", 1, 0, None)]
    assert not check.duplicated and not check.ok


def test_a_value_of_another_writer_is_foreign():
    check = check_values("1", {}, {0: [(0, "2.0"), (1, None)]})
    assert check.foreign == 2 and not check.ok
