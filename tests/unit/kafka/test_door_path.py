"""The Kafka door's Produce and Fetch paths reach the log with no protobuf and no call by method name
(issue 47): every function on it, from the Kafka handler to the replica's request path, is read
here, and a name it uses that is a protobuf module or message, a servicer's method name as a
string, or the by-name service callers (``call.replica`` / ``call.admin``), fails the test.

The path is listed by hand, as a reader follows it; a function added on the way must be added
here too (the last test checks that each one calls the next)."""

from __future__ import annotations

import inspect
import types

import pytest
from google.protobuf.message import Message

from lowtide.kafka import apis_admin, apis_data, apis_groups, apis_txn
from lowtide.replica.delete_records import DeleteRecordsHandler as LeaderDeletes
from lowtide.replica.delete_records_handler import DeleteRecordsRequestHandler
from lowtide.replica.describe_producers_handler import DescribeProducersHandler
from lowtide.replica.fetch_handler import FetchHandler
from lowtide.replica.list_offsets_handler import ListOffsetsHandler
from lowtide.replica.manager import ReplicaManager
from lowtide.replica.produce_handler import ProduceHandler
from lowtide.replica.requests import ReplicaRequests
from lowtide.replica.txn_markers_handler import TxnMarkersHandler
from lowtide_pb import admin_pb2_grpc, replica_pb2, replica_pb2_grpc

# Each calls the next; the Produce handler also calls its diskless branch.
PRODUCE_CHAIN = [apis_data.produce, ProduceHandler.produce_steps, ReplicaManager.produce_steps,
                 ReplicaRequests.produce_steps]
FETCH_CHAIN = [apis_data.fetch, FetchHandler.fetch_steps, ReplicaManager.fetch_steps, ReplicaRequests.fetch_steps,
               ReplicaRequests._read]
LIST_OFFSETS_CHAIN = [apis_data.list_offsets, ListOffsetsHandler.list_offsets, ReplicaManager.list_offset,
                      ReplicaRequests.list_offset]
DELETE_RECORDS_CHAIN = [apis_admin.delete_records, DeleteRecordsRequestHandler.delete_records,
                        ReplicaManager.delete_records, LeaderDeletes.delete_records]
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


@pytest.mark.parametrize(("fn", "handler", "method"), [
    (apis_data.list_offsets, "services.offsets.list_offsets", "ListOffsets"),
    (apis_admin.delete_records, "services.deleter.delete_records", "DeleteRecords")])
def test_a_replica_answers_list_offsets_and_delete_records_in_process_and_only_else_asks_by_method_name(
        fn, handler, method):
    source = inspect.getsource(fn)
    in_process, _, front_door = source.partition("else:")
    assert handler in in_process and "_pb2" not in in_process
    assert f'call.admin("{method}"' in front_door


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


# Consumer groups and transactions (issue 47): every handler calls the front door's domain objects
# (Call.front) and the replica's handlers (KafkaServices) with lowtide.messages types.
def _handlers(module) -> list:
    return [fn for name, fn in vars(module).items()
            if inspect.isfunction(fn) and fn.__module__ == module.__name__ and not name.startswith("__")]


@pytest.mark.parametrize("fn", _handlers(apis_groups) + _handlers(apis_txn) + [
    DescribeProducersHandler.describe_producers, TxnMarkersHandler.write_txn_markers], ids=lambda f: f.__qualname__)
def test_a_group_or_transaction_request_reaches_its_coordinator_through_no_protobuf_and_no_method_name(fn):
    assert offences(fn) == []


def test_the_group_and_transaction_handlers_import_no_protobuf():
    for module in (apis_groups, apis_txn):
        assert not [name for name, value in vars(module).items()
                    if isinstance(value, types.ModuleType) and value.__name__.startswith("lowtide_pb")]
