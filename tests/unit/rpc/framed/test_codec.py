"""The replication listener's frames (lowtide.rpc.framed.codec), byte for byte, over a real socket pair."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from lowtide.errors import ClusterAuthorizationFailed, InvalidRequest, NetworkException
from lowtide.rpc.framed.codec import (
    CALL,
    ERROR,
    HELLO,
    MAX_FRAME_BYTES,
    REQUEST,
    FrameReader,
    decode_call,
    decode_error,
    decode_hello,
    encode_call,
    encode_error,
    encode_frame,
    encode_hello,
    read_frame_async,
    write_frame,
)


def test_a_frame_is_its_length_after_the_length_field_then_its_kind_then_its_payload():
    assert encode_frame(REQUEST, b"abc") == b"\x00\x00\x00\x04\x02abc"
    assert encode_frame(HELLO, b"") == b"\x00\x00\x00\x01\x01"


def test_frames_written_to_a_socket_are_read_back_whole_and_a_clean_close_reads_as_none():
    left, right = socket.socketpair()
    with left, right:
        big = bytes(range(256)) * 1024  # 256 KiB: written without a joined copy, read in pieces

        def write() -> None:  # on its own thread: the socket buffer is smaller than the frame
            write_frame(left, REQUEST, b"small")
            write_frame(left, REQUEST, big)
            left.shutdown(socket.SHUT_WR)

        writer = threading.Thread(target=write)
        writer.start()
        reader = FrameReader(right)
        assert reader.read() == (REQUEST, b"small")
        kind, payload = reader.read()
        assert (kind, bytes(payload)) == (REQUEST, big)
        assert reader.read() is None
        writer.join()


def test_a_stream_ending_inside_a_frame_is_a_network_exception():
    left, right = socket.socketpair()
    with left, right:
        left.sendall(encode_frame(REQUEST, b"abcdef")[:7])
        left.shutdown(socket.SHUT_WR)
        with pytest.raises(NetworkException, match="inside a frame"):
            FrameReader(right).read()


@pytest.mark.parametrize(("header", "message"), [
    (b"\x00\x00\x00\x02\x07", "unknown frame kind 7"),
    (b"\x00\x00\x00\x00\x02", "frame length 0"),
    ((MAX_FRAME_BYTES + 1).to_bytes(4, "big") + b"\x02", f"frame length {MAX_FRAME_BYTES + 1}"),
])
def test_a_bad_kind_or_length_is_refused_before_any_payload_is_read(header, message):
    left, right = socket.socketpair()
    with left, right:
        left.sendall(header)
        with pytest.raises(InvalidRequest, match=message):
            FrameReader(right).read()


def test_an_oversize_or_unknown_frame_is_refused_when_encoding():
    with pytest.raises(InvalidRequest, match="unknown frame kind"):
        encode_frame(9, b"")
    left, right = socket.socketpair()
    with left, right, pytest.raises(InvalidRequest, match="over the"):
        write_frame(left, REQUEST, memoryview(bytearray(MAX_FRAME_BYTES)))


def test_a_call_frame_is_its_method_name_length_and_name_then_the_request():
    payload = encode_call("CommitFile", b"\x0a\x01k")
    assert payload == b"\x0aCommitFile\x0a\x01k"
    assert encode_frame(CALL, payload) == b"\x00\x00\x00\x0f\x06\x0aCommitFile\x0a\x01k"
    assert decode_call(payload) == ("CommitFile", b"\x0a\x01k")
    assert decode_call(encode_call("X", b"")) == ("X", b"")
    for bad in (b"", b"\x00abc", b"\x05abc", b"\x02\xff\xfe"):
        with pytest.raises(InvalidRequest):
            decode_call(bad)
    for name in ("", "x" * 256, "Comm\u00efFile"):
        with pytest.raises(InvalidRequest):
            encode_call(name, b"")


def test_hello_carries_call_metadata_and_a_malformed_one_is_invalid_request():
    payload = encode_hello([("authorization", "Bearer t0k")])
    assert payload == b'{"metadata": [["authorization", "Bearer t0k"]]}'
    assert decode_hello(payload) == [("authorization", "Bearer t0k")]
    for bad in (b"not json", b'{"metadata": [["only-one"]]}', b'{"metadata": "x"}', b"{}"):
        with pytest.raises(InvalidRequest, match="malformed HELLO"):
            decode_hello(bad)


def test_an_error_frame_carries_the_kafka_error_code_and_message():
    payload = encode_error(ClusterAuthorizationFailed("User:alice is not broker 2"))
    assert payload == b'{"code": 31, "message": "User:alice is not broker 2"}'
    error = decode_error(payload)
    assert isinstance(error, ClusterAuthorizationFailed) and str(error) == "User:alice is not broker 2"
    assert isinstance(decode_error(b"garbage"), NetworkException)
    assert ERROR == 4


def read_async(data: bytes) -> list:
    """Every frame ``read_frame_async`` reads from ``data`` then end of stream; an error ends the list."""
    async def run() -> list:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        got: list = []
        try:
            while (frame := await read_frame_async(reader)) is not None:
                got.append(frame)
        except (InvalidRequest, NetworkException) as exc:
            got.append(exc)
        return got

    return asyncio.run(run())


def test_the_event_loop_reader_reads_the_same_frames_and_refuses_the_same_bad_ones():
    big = bytes(range(256)) * 1024
    assert read_async(encode_frame(REQUEST, b"small") + encode_frame(ERROR, big)) == [(REQUEST, b"small"),
                                                                                    (ERROR, big)]
    [truncated] = read_async(encode_frame(REQUEST, b"abcdef")[:7])
    assert isinstance(truncated, NetworkException) and "inside a frame" in str(truncated)
    [half_header] = read_async(b"\x00\x00")
    assert isinstance(half_header, NetworkException)
    [bad] = read_async(b"\x00\x00\x00\x02\x07")
    assert isinstance(bad, InvalidRequest) and "unknown frame kind 7" in str(bad)
