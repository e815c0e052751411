"""One router per resource."""

from fastapi import Response
from pydantic import BaseModel


def json_response(answer: BaseModel | bytes) -> Response:
    """An answer sent as it is serialised once: a model's JSON, or JSON bytes the scheduler
    wrote itself (`answers`). FastAPI would validate and serialise a returned model a second
    time.

    Hot routes (leases, results, batches) return this; their `response_model` still documents
    the schema.
    """
    content = answer if isinstance(answer, bytes) else answer.model_dump_json()
    return Response(content=content, media_type="application/json")
