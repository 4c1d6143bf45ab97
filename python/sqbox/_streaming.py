"""Streamed output (PROTOCOL.md, "Streaming output"): `output` events of a `run` or an `exec`
that asked for them with `"stream": true`, handed to the caller's `on_stdout`/`on_stderr`
callbacks as they arrive, before the final result (which still carries all of the output).

Back-pressure is the callbacks themselves: they run on the client's reader (the thread or the
task that reads the server's replies), so while one is busy nothing more is read, the server
stops reading the sandbox's output once its client is 1 MiB behind, and the payload blocks on
its full pipe. Neither side holds more than that, however much the payload prints.
"""
from __future__ import annotations

import base64
import binascii
import codecs
import inspect
from typing import Any, Awaitable, Callable, Dict, Mapping, Optional, Union

from ._errors import SqboxError

# A callback gets each chunk as text (UTF-8, invalid bytes replaced, no character split).
OutputCallback = Callable[[str], Union[None, Awaitable[None]]]

STREAMS = ("stdout", "stderr")


def refuse_on_reader(on_reader: bool) -> None:
    """A request made by a callback, on the reader, would wait for a reply that only the
    reader, busy in that callback, could deliver."""
    if on_reader:
        raise SqboxError("an output callback cannot call the sandbox (its replies wait for the "
                         "callback to return)")


class OutputEvent:
    """An `output` event: the request's id, the stream, and the chunk (text, or bytes when the
    request asked for base64)."""

    __slots__ = ("id", "stream", "data")

    def __init__(self, message: Mapping[str, Any]) -> None:
        """Raises ValueError for a malformed event (a session's code can forge one)."""
        request_id, stream = message.get("id"), message.get("stream")
        if not (isinstance(request_id, (str, int)) and not isinstance(request_id, bool)) \
                or stream not in STREAMS:
            raise ValueError("malformed output event")
        data: Union[str, bytes]
        if "data_b64" in message:
            text = message["data_b64"]
            if not isinstance(text, str):
                raise ValueError("malformed output event")
            try:
                data = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("malformed output event") from None
        else:
            data = message.get("data")
            if not isinstance(data, str):
                raise ValueError("malformed output event")
        self.id, self.stream, self.data = request_id, stream, data


def is_output_event(message: Mapping[str, Any]) -> bool:
    return message.get("event") == "output"


class OutputSink:
    """The callbacks of one request. The first exception a callback raises is kept (that
    stream's later chunks then go nowhere) and raised by the call once its reply is in."""

    def __init__(self, on_stdout: Optional[OutputCallback],
                 on_stderr: Optional[OutputCallback]) -> None:
        for name, fn in (("on_stdout", on_stdout), ("on_stderr", on_stderr)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable")
        self._callbacks: Dict[str, Optional[OutputCallback]] = {"stdout": on_stdout,
                                                                "stderr": on_stderr}
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace")
                          for name in STREAMS}
        self.error: Optional[BaseException] = None

    @staticmethod
    def wanted(on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback],
               ) -> Optional["OutputSink"]:
        """A sink when there is a callback, else None (the request then asks for no events)."""
        if on_stdout is None and on_stderr is None:
            return None
        return OutputSink(on_stdout, on_stderr)

    def _text(self, event: OutputEvent) -> str:
        if isinstance(event.data, bytes):
            return self._decoders[event.stream].decode(event.data)
        return event.data

    def _target(self, event: OutputEvent) -> Optional[OutputCallback]:
        if self.error is not None:
            return None
        return self._callbacks[event.stream]

    def feed(self, event: OutputEvent) -> None:
        """Calls the stream's callback (the blocking client's reader thread)."""
        fn = self._target(event)
        text = self._text(event)
        if fn is None or not text:
            return
        try:
            fn(text)
        except Exception as exc:  # the caller's, raised from its call
            self.error = exc

    async def afeed(self, event: OutputEvent) -> None:
        """Calls (and awaits, for a coroutine function) the stream's callback (the asyncio
        client's reader task)."""
        fn = self._target(event)
        text = self._text(event)
        if fn is None or not text:
            return
        try:
            result = fn(text)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            self.error = exc

    def _rests(self) -> "list[OutputEvent]":
        # A character the stream's end cut short (binary events split anywhere): replaced.
        rests = []
        for name in STREAMS:
            rest = self._decoders[name].decode(b"", True)
            if rest:
                rests.append(OutputEvent({"id": 0, "stream": name, "data": rest}))
        return rests

    def finish(self) -> None:
        """The reply is in: what the decoders held goes out, then a callback's error is
        raised."""
        for event in self._rests():
            self.feed(event)
        if self.error is not None:
            raise self.error

    async def afinish(self) -> None:
        for event in self._rests():
            await self.afeed(event)
        if self.error is not None:
            raise self.error
