"""Drive the official RocketMQ client (librocketmq, from the ``rocketmq`` wheel) in a process.

The end-to-end tests run this as a subprocess, so that the C++ client's threads and global
state stay out of the test process. Each command prints one JSON document::

    produce NAMESRV TOPIC COUNT [PREFIX [LEVEL]]
                                                {"statuses": [...], "errors": [...]}; LEVEL:
                                                the messages' delay level
    batch NAMESRV TOPIC COUNT [PREFIX]          one send_batch of COUNT messages
    push NAMESRV TOPIC GROUP EXPECT TIMEOUT [DELAY]
                                                {"bodies": [...]} (duplicates kept); DELAY
                                                seconds per message, one thread
    retry NAMESRV TOPIC GROUP EXPECT TIMEOUT    like push, but the first delivery of each
                                                message fails (so it is sent back)
    pull NAMESRV TOPIC GROUP                    {"bodies": [...]}

With ``RMQ_ACCESS_KEY`` and ``RMQ_SECRET_KEY`` in the environment every client signs its
requests (``set_session_credentials``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from rocketmq.client import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
)


def credentials(client: Any) -> None:
    """Sign with the account in the environment, if any."""
    if os.environ.get("RMQ_ACCESS_KEY"):
        client.set_session_credentials(
            os.environ["RMQ_ACCESS_KEY"], os.environ.get("RMQ_SECRET_KEY", ""), "ALIYUN"
        )


def produce(namesrv: str, topic: str, count: int, prefix: str, level: int = 0) -> dict[str, Any]:
    producer = Producer(f"PG-{prefix}")
    producer.set_namesrv_addr(namesrv)
    credentials(producer)
    producer.set_timeout(5000)
    producer.start()
    statuses, errors, ids = [], [], []
    for i in range(count):
        message = Message(topic)
        message.set_keys(f"{prefix}-k{i}")
        message.set_tags("TagA")
        message.set_body(f"{prefix}-{i}")
        if level:
            message.set_delay_time_level(level)
        try:
            result = producer.send_sync(message)
            statuses.append(result.status.name)
            ids.append(result.msg_id)
        except Exception as exc:
            errors.append(repr(exc)[:300])
    producer.shutdown()
    return {"statuses": statuses, "errors": errors, "ids": ids}


def batch(namesrv: str, topic: str, count: int, prefix: str) -> dict[str, Any]:
    producer = Producer(f"PG-{prefix}")
    producer.set_namesrv_addr(namesrv)
    credentials(producer)
    producer.start()
    messages = []
    for i in range(count):
        message = Message(topic)
        message.set_tags("TagB")
        message.set_body(f"{prefix}-{i}")
        messages.append(message)
    try:
        result = producer.send_batch(messages)
        out: dict[str, Any] = {"statuses": [result.status.name], "errors": []}
    except Exception as exc:
        out = {"statuses": [], "errors": [repr(exc)[:300]]}
    producer.shutdown()
    return out


def push(
    namesrv: str,
    topic: str,
    group: str,
    expect: int,
    timeout: float,
    *,
    delay: float = 0.0,
    fail_first: bool = False,
) -> dict[str, Any]:
    bodies: list[str] = []
    failed: set[str] = set()
    lock = threading.Lock()

    def on_message(message: Any) -> None:
        time.sleep(delay)  # a slow consumer: messages wait in the client's process queue
        body = message.body.decode()
        with lock:
            if fail_first and body not in failed:
                failed.add(body)
                raise RuntimeError(f"failing {body} once")  # reconsume later: sent back
            bodies.append(body)
        print(f"got {message.body.decode()}", file=sys.stderr, flush=True)

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    credentials(consumer)
    if delay:
        consumer.set_thread_count(1)
    consumer.subscribe(topic, on_message)
    consumer.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with lock:
            if len(set(bodies)) >= expect:
                break
        time.sleep(0.05)
    time.sleep(1.0)  # let any duplicate arrive before judging
    consumer.shutdown()
    with lock:
        return {"bodies": list(bodies)}


def pull(namesrv: str, topic: str, group: str) -> dict[str, Any]:
    consumer = PullConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    credentials(consumer)
    consumer.start()
    bodies = [message.body.decode() for message in consumer.pull(topic)]
    consumer.shutdown()
    return {"bodies": bodies}


def main(argv: list[str]) -> None:
    command, namesrv, topic, *rest = argv
    if command == "produce":
        out = produce(
            namesrv,
            topic,
            int(rest[0]),
            rest[1] if len(rest) > 1 else "m",
            int(rest[2]) if len(rest) > 2 else 0,
        )
    elif command == "batch":
        out = batch(namesrv, topic, int(rest[0]), rest[1] if len(rest) > 1 else "b")
    elif command == "push":
        delay = float(rest[3]) if len(rest) > 3 else 0.0
        out = push(namesrv, topic, rest[0], int(rest[1]), float(rest[2]), delay=delay)
    elif command == "retry":
        out = push(namesrv, topic, rest[0], int(rest[1]), float(rest[2]), fail_first=True)
    elif command == "pull":
        out = pull(namesrv, topic, rest[0])
    else:
        raise SystemExit(f"unknown command {command!r}")
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
