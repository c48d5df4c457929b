"""The schema registry wire format of Kafka records, and decoding its Avro.

A record written through a registry-aware serializer (Apicurio's converter in Confluent mode,
Confluent's own) is framed as: magic byte 0, the writer schema's id (4 bytes, big-endian), then the
Avro binary body. The id resolves through the registry's Confluent-compatible API
(`GET /schemas/ids/{id}`). Shared by the Transform job (which hands the schemas to spark-avro) and
the DatabusConsumer runtime (which decodes each record with fastavro).
"""

from __future__ import annotations

import io
import json
import struct
import threading
from typing import Any
from urllib.parse import quote

import httpx

from fibers import failpoints

MAGIC = 0
HEADER = struct.Struct(">bI")  # magic byte, schema id


class WireFormatError(ValueError):
    """The bytes are not in the registry's wire format, or their schema cannot be had."""


class RegistryUnavailable(Exception):
    """The registry did not answer, or answered 429/5xx: no fault of the record, so worth asking again.
    Not a ValueError (what a record that cannot be decoded raises), and marked `transient` for decoders."""

    transient = True


def split(data: bytes) -> tuple[int, bytes]:
    """(schema id, Avro body) of one framed record."""
    if len(data) < HEADER.size:
        raise WireFormatError(f"{len(data)} bytes: too short for the registry's wire format")
    magic, schema_id = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WireFormatError(f"magic byte {magic}, not {MAGIC}: not written through a schema registry")
    return schema_id, data[HEADER.size :]


class Registry:
    """Reads schemas by id (and a subject's versions) from a Confluent-compatible API; ids never change, so
    each is fetched once."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        self._texts: dict[int, str] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._http.close()

    def _get(self, path: str) -> Any:
        try:
            failpoints.hit("registry.lookup", httpx.ConnectError)
            reply = self._http.get(path)
        except httpx.HTTPError as exc:
            raise RegistryUnavailable(f"schema registry at {self.url}: {exc or type(exc).__name__}") from None
        if reply.status_code == 404:  # the schema id or subject is not there: the record's fault, not the registry's
            raise WireFormatError(f"schema registry at {self.url}{path}: HTTP 404 {reply.text[:200]}")
        if reply.status_code != 200:  # 429, 5xx, and 401/403 (credentials rotated): never a reason to pass records
            raise RegistryUnavailable(f"schema registry at {self.url}{path}: HTTP {reply.status_code}")
        try:
            return reply.json()
        except ValueError:
            raise RegistryUnavailable(f"schema registry at {self.url}{path}: an answer that is not JSON") from None

    def schema_text(self, schema_id: int) -> str:
        """The schema with this id, as the registry holds it (Avro JSON)."""
        with self._lock:
            if schema_id not in self._texts:
                self._texts[schema_id] = str(self._get(f"/schemas/ids/{schema_id}")["schema"])
            return self._texts[schema_id]

    def register(self, subject: str, schema: str) -> int:
        """Register an Avro schema under the subject (or find it there); its id."""
        try:
            reply = self._http.post(
                f"/subjects/{quote(subject, safe='')}/versions",
                json={"schema": schema, "schemaType": "AVRO"},
                headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
            )
        except httpx.HTTPError as exc:
            raise WireFormatError(f"schema registry at {self.url}: {exc or type(exc).__name__}") from None
        if reply.status_code != 200:
            raise WireFormatError(
                f"registering under {subject!r} was refused: HTTP {reply.status_code} {reply.text[:500]}"
            )
        return int(reply.json()["id"])

    def subject_schemas(self, subject: str) -> tuple[dict[int, str], str]:
        """Every live version's schema of `subject` by id, and the latest one's text."""
        by_id: dict[int, str] = {}
        latest = ""
        path = f"/subjects/{quote(subject, safe='')}/versions"
        for version in sorted(int(v) for v in self._get(path)):
            found = self._get(f"{path}/{version}")
            by_id[int(found["id"])] = latest = str(found["schema"])
        with self._lock:
            self._texts.update(by_id)
        if not by_id:
            raise WireFormatError(f"subject {subject!r} has no versions in the schema registry")
        return by_id, latest


class AvroDecoder:
    """Framed Avro bytes → Python values (records as dicts), with the writer schema from the registry."""

    def __init__(self, registry: Registry) -> None:
        import fastavro  # the jobs image has it; the operator never decodes records

        self._fastavro = fastavro
        self.registry = registry
        self._parsed: dict[int, Any] = {}

    def __call__(self, data: bytes) -> Any:
        schema_id, body = split(data)
        schema = self._parsed.get(schema_id)
        if schema is None:
            schema = self._fastavro.parse_schema(json.loads(self.registry.schema_text(schema_id)))
            self._parsed[schema_id] = schema
        return self._fastavro.schemaless_reader(io.BytesIO(body), schema, None)
