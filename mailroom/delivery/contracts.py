"""What a delivery stream entry carries: only the id of a ``channel_message`` row."""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: Field of a stream entry holding the JSON payload.
PAYLOAD_FIELD = "payload"


class StreamEntry(BaseModel):
    """The JSON payload of one stream entry; Postgres holds the message itself."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    message_id: int = Field(gt=0)


def encode_entry(message_id: int) -> dict[str, str]:
    return {PAYLOAD_FIELD: json.dumps({"message_id": message_id})}


def decode_entry(fields: dict[bytes, bytes] | dict[str, str]) -> int | None:
    """The message id of a stream entry, or None when the entry is malformed."""
    raw = fields.get(PAYLOAD_FIELD.encode()) if fields else None  # type: ignore[call-overload]
    if raw is None and fields:
        raw = fields.get(PAYLOAD_FIELD)  # type: ignore[call-overload]
    return decode_payload(raw)


def decode_payload(raw: bytes | str | None) -> int | None:
    """The message id in an entry's payload field, or None when it is malformed or absent."""
    if raw is None:
        return None
    # Fast path for the well-formed entry (the bridge decodes a whole backlog); anything
    # else is left to the model, whose verdict is the contract.
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    message_id = data.get("message_id") if isinstance(data, dict) else None
    if type(message_id) is int and message_id > 0:
        return message_id
    try:
        return StreamEntry.model_validate_json(raw).message_id
    except ValidationError:
        return None
