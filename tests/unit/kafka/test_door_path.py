"""The Kafka door's Produce and Fetch paths reach the log with no protobuf and no call by method name
(issue 47): every function on it, from the Kafka handler to the replica's request path, is read
here, and a name it uses that is a protobuf module or message, a servicer's method name as a
string, or the by-name service callers (``call.replica`` / ``call.admin``), fails the test.

The path is listed by hand, as a reader follows it; a function added on the way must be added
here too (the last test checks that each one calls the next)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest
from google.protobuf.message import Message

from lowtide import kafka
from lowtide.kafka import apis_admin, apis_cluster, apis_data, server
from lowtide.replica.delete_records import DeleteRecordsHandler as LeaderDeletes
from lowtide.replica.delete_records_handler import DeleteRecordsRequestHandler
from lowtide.replica.describe_producers_handler import DescribeProducersHandler
from lowtide.replica.fetch_handler import FetchHandler
from lowtide.replica.leader_epoch_handler import OffsetForLeaderEpochHandler
from lowtide.replica.list_offsets_handler import ListOffsetsHandler
from lowtide.replica.produce_handler import ProduceHandler
from lowtide.replica.requests import ReplicaRequests
from lowtide.replica.txn_markers_handler import TxnMarkersHandler
from lowtide_pb import admin_pb2_grpc, replica_pb2, replica_pb2_grpc

# Each calls the next; the Produce handler also calls its diskless branch.
PRODUCE_CHAIN = [apis_data.produce, ProduceHandler.produce_steps,
                 ReplicaRequests.produce_steps]
FETCH_CHAIN = [apis_data.fetch, FetchHandler.fetch_steps, ReplicaRequests.fetch_steps,
               ReplicaRequests._read]
LIST_OFFSETS_CHAIN = [apis_data.list_offsets, ListOffsetsHandler.list_offsets,
                      ReplicaRequests.list_offset]
DELETE_RECORDS_CHAIN = [apis_admin.delete_records, DeleteRecordsRequestHandler.delete_records,
                        LeaderDeletes.delete_records]
# The Kafka handlers of ListOffsets and DeleteRecords keep a branch for a front door's listener
# (no replica there: it asks the leaders through its Admin service); the test below reads them.
DOOR_PATHS = [*PRODUCE_CHAIN, ProduceHandler._produce_diskless, *FETCH_CHAIN, *LIST_OFFSETS_CHAIN[1:],
              *DELETE_RECORDS_CHAIN[1:], DeleteRecordsRequestHandler.serves_here]

SERVICER_METHODS = {name for servicer in (replica_pb2_grpc.ReplicaServicer, admin_pb2_grpc.AdminServicer)
                    for name in vars(servicer) if not name.startswith("_")}


def _codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def offences(fn) -> list[str]:
    """What on ``fn``'s body puts protobuf or a call by method name on the path."""
    fn = inspect.unwrap(fn)
    found = []
    for code in _codes(fn.__code__):
        for name in code.co_names:
            value = fn.__globals__.get(name)
            if isinstance(value, types.ModuleType) and value.__name__.startswith("lowtide_pb"):
                found.append(f"uses the protobuf module {name}")
            elif isinstance(value, type) and issubclass(value, Message):
                found.append(f"uses the protobuf message {name}")
        if {"replica", "admin"} & set(code.co_names) and "call" in code.co_varnames:
            found.append("calls a service by method name (call.replica / call.admin)")
        found += [f"names the servicer method {c!r}" for c in code.co_consts
                  if isinstance(c, str) and c in SERVICER_METHODS]
    return found


@pytest.mark.parametrize("fn", DOOR_PATHS, ids=lambda f: f.__qualname__)
def test_a_kafka_produce_or_fetch_reaches_the_log_through_no_protobuf_and_no_method_name(fn):
    assert offences(fn) == []


@pytest.mark.parametrize(("fn", "handler", "front_door"), [
    (apis_data.list_offsets, "services.offsets.list_offsets", "call.front.topics.list_offsets("),
    (apis_admin.delete_records, "services.deleter.delete_records", "call.front.deleter.delete_records(")])
def test_a_replica_answers_list_offsets_and_delete_records_in_process_and_only_else_asks_the_front_door(
        fn, handler, front_door):
    source = inspect.getsource(fn)
    in_process, _, elsewhere = source.partition("else:")
    assert handler in in_process and "call.front" not in in_process
    assert front_door in elsewhere and handler not in elsewhere
    assert offences(fn) == []


def test_the_check_catches_a_protobuf_request_and_a_call_by_method_name():
    def wrapped(call, body):
        return call.replica("Produce", replica_pb2.ProduceRequest(acks=body.acks))

    assert sorted(offences(wrapped)) == ["calls a service by method name (call.replica / call.admin)",
                                         "names the servicer method 'Produce'", "uses the protobuf module replica_pb2"]


def test_each_function_on_the_path_calls_the_next():
    def names(fn) -> set[str]:
        return {n for code in _codes(inspect.unwrap(fn).__code__) for n in code.co_names}

    for chain in (PRODUCE_CHAIN, FETCH_CHAIN, LIST_OFFSETS_CHAIN, DELETE_RECORDS_CHAIN):
        for fn, following in zip(chain, chain[1:], strict=False):
            assert following.__name__ in names(fn), f"{fn.__qualname__} does not call {following.__qualname__}"
    assert "_produce_diskless" in names(ProduceHandler.produce_steps)


# -- every Kafka handler (issue 47) ---------------------------------------------------------------
# Every function of every lowtide.kafka.apis_* module calls the front door's objects (Call.front) and
# the replica's handlers (KafkaServices) with lowtide.messages types; none imports protobuf. A module
# added later is checked too (found by name, not listed here).
APIS_MODULES = [importlib.import_module(f"lowtide.kafka.{m.name}") for m in pkgutil.iter_modules(kafka.__path__)
                if m.name.startswith("apis_")]
KAFKA_HANDLERS = [fn for module in APIS_MODULES for fn in vars(module).values()
                  if inspect.isfunction(fn) and fn.__module__ == module.__name__]
KAFKA_HANDLERS += [cls_fn for module in APIS_MODULES for cls in vars(module).values()
                   if inspect.isclass(cls) and cls.__module__ == module.__name__
                   for cls_fn in vars(cls).values() if inspect.isfunction(cls_fn)]
REPLICA_HANDLERS = [DescribeProducersHandler.describe_producers, TxnMarkersHandler.write_txn_markers]
OFFSET_FOR_LEADER_EPOCH_CHAIN = [apis_cluster.offset_for_leader_epoch,
                                 OffsetForLeaderEpochHandler.offset_for_leader_epoch,
                                 ReplicaRequests.offset_for_leader_epoch]


def test_every_module_serving_a_kafka_api_is_checked():
    served = {api.handler.__module__ for api in server.all_apis()}
    assert served == {m.__name__ for m in APIS_MODULES} and len(KAFKA_HANDLERS) > 100


@pytest.mark.parametrize("fn", KAFKA_HANDLERS + REPLICA_HANDLERS + OFFSET_FOR_LEADER_EPOCH_CHAIN[1:],
                         ids=lambda f: f"{f.__module__.rpartition('.')[2]}.{f.__qualname__}")
def test_a_kafka_request_reaches_its_handler_through_no_protobuf_and_no_method_name(fn):
    assert offences(fn) == []


@pytest.mark.parametrize("module", APIS_MODULES, ids=lambda m: m.__name__)
def test_no_kafka_apis_module_imports_protobuf(module):
    assert [name for name, value in vars(module).items()
            if isinstance(value, types.ModuleType) and value.__name__.startswith("lowtide_pb")] == []


def test_each_function_on_the_leader_epoch_path_calls_the_next():
    def names(fn) -> set[str]:
        return {n for code in _codes(inspect.unwrap(fn).__code__) for n in code.co_names}

    for fn, following in zip(OFFSET_FOR_LEADER_EPOCH_CHAIN, OFFSET_FOR_LEADER_EPOCH_CHAIN[1:], strict=False):
        assert following.__name__ in names(fn), f"{fn.__qualname__} does not call {following.__qualname__}"
