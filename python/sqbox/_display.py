"""Rich results of a session: display data beside the text, as a notebook kernel gives them."""
from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ._errors import ProtocolError


@dataclass(frozen=True)
class DisplayData:
    """One displayed object: `data` maps MIME types to values (images base64-encoded, JSON as
    decoded JSON, the rest text). `text` is always there (the object's repr). In Jupyter on the
    host it shows itself as the sandbox's notebook would."""

    data: Dict[str, Any]

    def _image(self, mime: str) -> Optional[bytes]:
        value = self.data.get(mime)
        if value is None:
            return None
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return None

    @property
    def png(self) -> Optional[bytes]:
        """The PNG image's bytes, if any."""
        return self._image("image/png")

    @property
    def jpeg(self) -> Optional[bytes]:
        return self._image("image/jpeg")

    @property
    def html(self) -> Optional[str]:
        return self.data.get("text/html")

    @property
    def svg(self) -> Optional[str]:
        return self.data.get("image/svg+xml")

    @property
    def json(self) -> Any:
        return self.data.get("application/json")

    @property
    def text(self) -> str:
        return self.data.get("text/plain", "")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Dict[str, Any]:
        return dict(self.data)


def display_from_reply(reply: Mapping[str, Any]) -> Tuple[DisplayData, ...]:
    """The exec reply's display items; ProtocolError if they are malformed."""
    items = reply.get("display", [])
    if not isinstance(items, list):
        raise ProtocolError("malformed reply: 'display' must be a list")
    found: List[DisplayData] = []
    for item in items:
        data = item.get("data") if isinstance(item, dict) else None
        if not isinstance(data, dict):
            raise ProtocolError("malformed reply: each display item needs a 'data' object")
        for mime, value in data.items():
            if mime == "application/json" or mime.endswith("+json"):
                try:
                    json.dumps(value, allow_nan=False)
                except (TypeError, ValueError):
                    raise ProtocolError(f"malformed reply: {mime} is not JSON") from None
            elif not isinstance(value, str):
                raise ProtocolError(f"malformed reply: display data {mime!r} must be text")
        found.append(DisplayData(data=dict(data)))
    return tuple(found)
