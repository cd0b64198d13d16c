"""A Docker exec's output, read without losing its first frames.

An exec's output comes back on the hijacked HTTP connection as Docker's multiplexed stream: frames of an 8-byte
header (stream: 1 stdout, 2 stderr, 3 the engine's own error; 3 zero bytes; big-endian size) and that many bytes.
docker-py (`exec_start(stream=True)`, `exec_run`, `utils.socket.frames_iter`) reads those frames from the socket
*under* the buffered reader that http.client read the response's head through. When the first frames arrive with
the head (a command that prints at once, on a loaded machine), they sit in that buffer and docker-py never sees
them: the stream ends early (an empty tar of the repository) or is read out of step, payload bytes taken for a
header ("0 is not a valid stream", "34 is not a valid stream"). Here the frames are read through that buffered
reader, so nothing that arrived is skipped; a stream that is not framed as Docker frames it is a SandboxError.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable, Iterator

from trainer.environments.swe.sandbox import SandboxError

STDOUT, STDERR, ENGINE_ERROR = 1, 2, 3
HEADER_BYTES = 8
READ_BYTES = 64 * 1024


class ExecStream:
    """A started exec's connection: `send` its standard input (the exec created with `stdin=True`), then read its
    `frames` to the end; `close` (or `with`) ends the connection."""

    def __init__(self, api, exec_id: str):
        self._socket = api.exec_start(exec_id, socket=True)
        response = getattr(self._socket, "_response", None)
        try:
            self._reader = response.raw._fp.fp  # requests -> urllib3 -> http.client -> the buffered reader
        except AttributeError:
            self._socket.close()
            raise SandboxError(
                "docker-py's exec connection has no buffered reader where this reader expects it "
                "(exec_stream.py reads docker-py's response.raw._fp.fp; docker-py changed?)"
            ) from None
        self._response = response

    def __enter__(self) -> ExecStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, chunks: Iterable[bytes]) -> None:
        """Write `chunks` to the exec's standard input, then close it (the command sees the end of its input)."""
        raw = getattr(self._socket, "_sock", self._socket)
        for chunk in chunks:
            raw.sendall(chunk)
        raw.shutdown(socket.SHUT_WR)

    def frames(self) -> Iterator[tuple[int, bytes]]:
        """(stream, bytes) in the order the exec wrote them (STDOUT or STDERR), up to `READ_BYTES` at a time, to the
        end of the stream. SandboxError for the engine's own error frame or a stream out of frame."""
        return read_frames(self._reader)

    def close(self) -> None:
        self._response.close()  # the buffered reader, then the socket under it
        with contextlib.suppress(OSError):
            self._socket.close()


def read_frames(reader) -> Iterator[tuple[int, bytes]]:
    """Docker's multiplexed stream from a buffered binary file (`read(n)` blocks for n bytes or the end, `read1`
    returns what one read gives): (stream, bytes) chunks of each frame's payload."""
    while True:
        header = reader.read(HEADER_BYTES)
        if not header:
            return
        stream, size = header[0], int.from_bytes(header[4:], "big")
        if len(header) < HEADER_BYTES or header[1:4] != b"\0\0\0" or stream not in (STDOUT, STDERR, ENGINE_ERROR):
            raise SandboxError(f"the exec's output is not framed as Docker frames it (a header {header!r})")
        payload = []
        while size:
            data = reader.read1(min(size, READ_BYTES))
            if not data:
                raise SandboxError(f"the exec's output ended inside a frame ({size} bytes short)")
            size -= len(data)
            if stream == ENGINE_ERROR:
                payload.append(data)
            else:
                yield stream, data
        if stream == ENGINE_ERROR:
            raise SandboxError(f"the Docker engine failed the exec: {b''.join(payload).decode(errors='replace')}")


def run_short(api, container_id: str, argv: list[str], user: str, workdir: str = "/") -> tuple[int | None, bytes]:
    """(exit code, stdout and stderr as written) of a short command run as `user`, as `Container.exec_run` gives
    them, read through `ExecStream`."""
    exec_id = api.exec_create(container_id, argv, stdout=True, stderr=True, user=user, workdir=workdir)["Id"]
    with ExecStream(api, exec_id) as stream:
        output = b"".join(data for _, data in stream.frames())
    return api.exec_inspect(exec_id).get("ExitCode"), output
