"""Reading a Docker exec's multiplexed stream (trainer/environments/swe/exec_stream.py) against docker-py's reader,
on a real socket and http.client, with frames that arrive together with the response's head (what a loaded
machine does; the preflight's intermittent "0 is not a valid stream" and empty tars of 2026-12-07)."""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading

import pytest

from trainer.environments.swe.exec_stream import ENGINE_ERROR, STDERR, STDOUT, read_frames
from trainer.environments.swe.sandbox import SandboxError

HEAD = (
    b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\n"
    b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
)


def frame(stream: int, payload: bytes) -> bytes:
    """Docker's frame: stream, three zero bytes, the payload's size big-endian (moby's stdcopy)."""
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def response_with(body: bytes) -> http.client.HTTPResponse:
    """An upgraded response whose head and `body` reached the client in one piece, its head read by http.client
    (keep it referenced while its `fp` is read: collecting it closes the file)."""
    client, engine = socket.socketpair()

    def send():
        engine.sendall(HEAD + body)  # in one piece, before the client reads anything (beyond the socket's buffer:
        engine.close()  # as soon as the client reads)

    threading.Thread(target=send, daemon=True).start()
    response = http.client.HTTPResponse(client)
    response.begin()
    assert response.status == 101
    return response


TAR_LIKE = frame(STDOUT, b"./repo/a.py\0" + b"\0" * 500) + frame(STDERR, b"tar: warning\n") + frame(STDOUT, b'"x"' * 9)


def test_frames_that_came_with_the_head_are_read():
    response = response_with(TAR_LIKE)
    got = list(read_frames(response.fp))
    assert got == [(STDOUT, b"./repo/a.py\0" + b"\0" * 500), (STDERR, b"tar: warning\n"), (STDOUT, b'"x"' * 9)]


def test_docker_py_reading_under_the_buffer_loses_them():
    """The reference: docker-py's reader on the socket under http.client's buffer (what `exec_start(stream=True)`
    does) gets none of these frames: the stream looks empty, as the preflight's empty tar did."""
    from docker.utils.socket import frames_iter  # the test extra brings docker (README's test command)

    response = response_with(TAR_LIKE)
    assert list(frames_iter(response.fp.raw, tty=False)) == []


def test_a_large_frame_comes_in_pieces_of_at_most_read_bytes():
    payload = bytes(range(256)) * 1024  # 256 KiB
    response = response_with(frame(STDOUT, payload))
    got = list(read_frames(response.fp))
    assert b"".join(data for _, data in got) == payload and {stream for stream, _ in got} == {STDOUT}
    assert len(got) >= 4


@pytest.mark.parametrize(
    "body, message",
    [
        (b"\x22\0\0\0\0\0\0\x01x", "not framed as Docker frames it"),  # payload taken for a header: stream 34
        (frame(STDOUT, b"abc")[:-1], "ended inside a frame (1 bytes short)"),
        (frame(STDOUT, b"ok") + b"\x01\0\0", "not framed"),  # a header cut short
        (
            frame(ENGINE_ERROR, b"exec failed: no such user"),
            "the Docker engine failed the exec: exec failed: no such user",
        ),
    ],
)
def test_a_stream_out_of_frame_is_a_sandbox_error(body, message):
    response = response_with(body)
    with pytest.raises(SandboxError, match=re.escape(message)):
        list(read_frames(response.fp))
