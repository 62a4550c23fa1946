"""Sending by name: the registry names declared actors, and a message sent by name is the
one the actor's own ``send`` makes (the bridges and the scheduler never import the actors)."""

from __future__ import annotations

import dramatiq
import pytest

from actors.broker.transport import send
from mailroom import queues as actor_names


@pytest.mark.parametrize("target", actor_names.SENT_BY_NAME, ids=lambda target: target.name)
def test_every_name_sent_to_is_a_declared_actor_on_its_queue(stub_broker, target):
    actor = stub_broker.get_actor(target.name)
    assert actor.queue_name == target.queue
    assert target.queue in actor_names.ALL


def _queued(broker) -> list[dramatiq.Message]:
    return [
        dramatiq.Message.decode(data) for queue in broker.queues.values() for data in queue.queue
    ]


def test_a_message_sent_by_name_is_the_one_the_actor_sends(stub_broker):
    target = actor_names.APPLY_RECOGNITION_MESSAGES
    items = [{"subject": "recognition.ack", "data": "e30=", "headers": {"Nats-Msg-Id": "1"}}]
    stub_broker.get_actor(target.name).send(items)
    send(target, items)

    by_actor, by_name = _queued(stub_broker)
    assert by_name.message_id != by_actor.message_id
    same = {"message_id", "message_timestamp"}
    assert {k: v for k, v in by_name.asdict().items() if k not in same} == {
        k: v for k, v in by_actor.asdict().items() if k not in same
    }
