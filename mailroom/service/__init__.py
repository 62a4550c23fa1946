"""A kit for writing a recognition service for Mailroom in Python.

It does the protocol (subscribe in the queue group, ack, read the object, write the result
document, publish the result through JetStream with its PubAck, retried under the same
``Nats-Msg-Id``, answer a repeated request with the same answer) around one function of
yours that reads a file. It depends on nothing of Mailroom but the contract's models
(``mailroom.recognition.contract.models``)::

    nc = await nats.connect(["nats://nats-1:4222", "nats://nats-2:4222"])
    service = RecognitionService(
        nc,
        objects=my_store,             # read(bucket, key), write_result(key, body), results_bucket
        recognize=read_invoice,       # async (request, data) -> RecognitionResult | Failure
        service=ServiceInfo(name="invoice-reader", version="1.4.0"),
        request_subjects=["files.tabular_uploaded"],
        answers_subject="files.tabular_parsed",
    )
    await service.start()
    ...
    await service.stop()
    await nc.drain()

``mailroom.recognizer`` (``mailroom recognizer``) is a service built on it.
"""

from __future__ import annotations

from mailroom.service.answering import Failure, result_key
from mailroom.service.publish import AnswerPublisher
from mailroom.service.runner import DEFAULT_QUEUE, Objects, RecognitionService, Recognize
from mailroom.service.wire import flushed

__all__ = [
    "DEFAULT_QUEUE",
    "AnswerPublisher",
    "Failure",
    "Objects",
    "RecognitionService",
    "Recognize",
    "flushed",
    "result_key",
]
