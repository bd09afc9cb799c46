"""The text message a ``conversation.item.create`` adds (the only item a lockstep model takes)."""

from __future__ import annotations

from typing import Final

from .. import error_codes as codes
from .converter import json_type
from .errors import ProtocolError, clip
from .parsing import MAX_EVENT_ID_CHARS
from .wire_events import ConversationItemCreate

TEXT_PART_TYPES: Final = frozenset({"input_text", "output_text", "text"})
MAX_TEXT_ITEM_CHARS: Final = 64 * 1024


def text_item(event: ConversationItemCreate) -> tuple[str, str, str | None]:
    """``(role, text, item id or None)`` of a ``conversation.item.create`` that adds a text
    message; anything else (another item type, audio or image parts, no text) refuses it with
    ``invalid_value`` naming what is not taken."""

    def refuse(message: str, param: str) -> ProtocolError:
        return ProtocolError(
            codes.INVALID_VALUE, message, param=param, event_type=event.TYPE, client_event_id=event.event_id
        )

    item = event.item
    kind = item.get("type", "message")
    if kind != "message":
        raise refuse(
            f"only text message items are taken (a lockstep model reads no {clip(repr(kind), 64)} item)",
            "item.type",
        )
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise refuse(
            f"item.role must be user, system, developer or assistant, not {clip(repr(role), 64)}", "item.role"
        )
    item_id = item.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not 0 < len(item_id) <= MAX_EVENT_ID_CHARS):
        raise refuse(f"item.id must be a string of 1 to {MAX_EVENT_ID_CHARS} characters", "item.id")
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise refuse("item.content must be a non-empty list of text parts", "item.content")
    texts = []
    for part in content:
        if (
            not isinstance(part, dict)
            or part.get("type") not in TEXT_PART_TYPES
            or not isinstance(part.get("text"), str)
        ):
            kind = part.get("type") if isinstance(part, dict) else json_type(part)
            raise refuse(
                f"only text parts are taken (input_text, output_text, text), not {clip(repr(kind), 64)}",
                "item.content",
            )
        texts.append(part["text"])
    text = "".join(texts)
    if len(text) > MAX_TEXT_ITEM_CHARS:
        raise refuse(f"an item's text is at most {MAX_TEXT_ITEM_CHARS} characters", "item.content")
    return role, text, item_id
