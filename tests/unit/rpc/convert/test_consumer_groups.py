"""KIP-848 consumer group descriptions across the gRPC boundary (``rpc/convert/consumer_groups``):
what a replica's listener gets from the front door reads back as the front door described it."""

from __future__ import annotations

from lowtide.errors import GroupIdNotFound
from lowtide.messages.consumer_groups import ConsumerGroupDescription, ConsumerMemberDescription, TopicPartitions
from lowtide.rpc.convert import consumer_groups as convert

TOPIC_ID = "0123456789abcdef0123456789abcdef"


def test_a_description_with_a_classic_member_reads_back_the_same():
    def member(member_id: str, *, classic: bool) -> ConsumerMemberDescription:
        owned = (TopicPartitions(topic_id=TOPIC_ID, partitions=(0, 1), topic="orders"),)
        return ConsumerMemberDescription(
            member_id=member_id, instance_id=None, rack_id="r1", member_epoch=4, client_id="c", client_host="/h",
            subscribed_topic_names=("orders",), subscribed_topic_regex=None, assignment=owned,
            target_assignment=owned, classic=classic)

    described = [ConsumerGroupDescription(group_id="g", state="Stable", group_epoch=4, assignment_epoch=4,
                                          assignor_name="uniform", authorized_operations=8,
                                          members=(member("new", classic=False), member("old", classic=True))),
                 ConsumerGroupDescription(group_id="none", error=GroupIdNotFound("Group none not found."))]
    back = convert.descriptions_from_proto(convert.descriptions_to_proto(described))
    assert back[0] == described[0]
    assert [m.classic for m in back[0].members] == [False, True]
    assert isinstance(back[1].error, GroupIdNotFound) and back[1].group_id == "none"
