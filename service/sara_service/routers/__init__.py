"""One router per resource."""

from fastapi import Response
from pydantic import BaseModel


def json_response(model: BaseModel) -> Response:
    """Serialise an answer model once; FastAPI would validate and serialise it a second time.

    Hot routes (leases, results, batches) return this; their `response_model` still documents
    the schema.
    """
    return Response(content=model.model_dump_json(), media_type="application/json")
