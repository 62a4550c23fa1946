"""The sample files the conformance check sends: one per pipeline, of a type it declares.

The check sends a service only the file types Mailroom's configuration declares for it
(``recognition.file_types``), as Mailroom would: a CSV-only service that answers
``UNSUPPORTED_TYPE`` to an image is never asked about one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from mailroom.adapters.storage import ObjectStore, content_key
from mailroom.recognition.contract.models import ObjectRef, Pipeline
from mailroom.settings import RecognitionSettings

#: A 1x1 PNG: an image service reads it; the reference recognizer finds no fields.
_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63000100000500010d0a2db40000000049454e44ae426082"
)
#: Sample files by file type: the pipeline that reads it and its bytes.
SAMPLES: dict[str, tuple[Pipeline, bytes]] = {
    "csv": ("tabular", b"invoice_number,total\nCHECK-1,1250.50\n"),
    "tsv": ("tabular", b"invoice_number\ttotal\nCHECK-1\t1250.50\n"),
    "txt": ("tabular", b"Invoice number: CHECK-1\nTotal: 1250.50\n"),
    "png": ("image", _PNG),
}
#: The type sent to a pipeline that declares every type.
EVERY_TYPE_SAMPLE: dict[Pipeline, str] = {"tabular": "csv", "image": "png"}


@dataclass(frozen=True)
class Sample:
    pipeline: Pipeline
    file_type: str
    data: bytes


def samples_to_send(recognition: RecognitionSettings) -> tuple[list[Sample], dict[str, str]]:
    """A sample per pipeline that declares a type the check has one of; and, per pipeline
    that declares only types it has none of, why that pipeline is not checked."""
    samples: list[Sample] = []
    unchecked: dict[str, str] = {}
    for pipeline, every in EVERY_TYPE_SAMPLE.items():
        declared = recognition.declared_types(pipeline)
        if declared == []:
            continue  # nothing is sent to this pipeline, so nothing is asked
        wanted = [every] if declared is None else declared
        known = [t for t in wanted if t in SAMPLES and SAMPLES[t][0] == pipeline]
        if not known:
            unchecked[pipeline] = (
                f"declares {', '.join(wanted)}, of which the check has no sample "
                f"(it has {', '.join(t for t, (p, _) in SAMPLES.items() if p == pipeline)})"
            )
            continue
        samples.append(Sample(pipeline, known[0], SAMPLES[known[0]][1]))
    return samples, unchecked


async def stored(store: ObjectStore, sample: Sample) -> ObjectRef:
    """Where ``sample`` is in the incoming bucket, once stored there."""
    key = content_key(sample.data, prefix="conformance", suffix=f".{sample.file_type}")
    ref = await store.put("incoming", key, sample.data, media_type="application/octet-stream")
    return ObjectRef(bucket=ref.bucket, key=ref.key)


def missing_object(store: ObjectStore, sample: Sample) -> ObjectRef:
    """A key of ``sample``'s type in the incoming bucket that holds nothing."""
    key = f"conformance/missing/{uuid.uuid4()}.{sample.file_type}"
    return ObjectRef(bucket=store.bucket("incoming"), key=key)
