"""A send's request header, typed once at the edge: ``SendMessageRequestHeader`` and ``V2``.

RocketMQ's producers send the same header two ways (docs/rocketmq-protocol.md §19): the Java
client's SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE with one-letter names (``a`` to ``m``, the
fields of ``SendMessageRequestHeaderV2``), the C++ client's SEND_MESSAGE (and a batch sent
with the long header) with ``SendMessageRequestHeader``'s names. :meth:`SendMessageHeader.
from_command` reads either into one frozen value, every number parsed once, so the send
path never looks at ``extFields`` again.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from trioha.remoting import HeaderError, RemotingCommand, RequestCode, int_field

#: ``subscriptionGroupConfig.retryMaxTimes`` default when the request does not say.
MAX_RECONSUME_TIMES = 16

#: SendMessageRequestHeader's names, in declaration order, and SendMessageRequestHeaderV2's
#: letter for each.
_LETTERS = {
    "producerGroup": "a",
    "topic": "b",
    "defaultTopic": "c",
    "defaultTopicQueueNums": "d",
    "queueId": "e",
    "sysFlag": "f",
    "bornTimestamp": "g",
    "flag": "h",
    "properties": "i",
    "reconsumeTimes": "j",
    "unitMode": "k",
    "maxReconsumeTimes": "l",
    "batch": "m",
}
#: The ``@CFNotNull`` fields, in declaration order (the first one missing is named).
_REQUIRED = (
    "producerGroup",
    "topic",
    "defaultTopic",
    "defaultTopicQueueNums",
    "queueId",
    "sysFlag",
    "bornTimestamp",
    "flag",
)
_REQUIRED_LONG = frozenset(_REQUIRED)
_REQUIRED_V2 = frozenset(_LETTERS[name] for name in _REQUIRED)


def _missing(fields: Mapping[str, str], v2: bool) -> HeaderError:
    """The :class:`HeaderError` naming the first ``@CFNotNull`` field *fields* lacks.

    A 4.9.7 broker logs the missing field while decoding the header, goes on with null, and
    fails where it unboxes the null (a NullPointerException): SYSTEM_ERROR. trioha answers the
    same code and says which field it was, in the words of ``decodeCommandCustomHeader``;
    nothing is stored or auto-created (docs/rocketmq-protocol.md §19: unlike 4.9.7, trioha also
    refuses a header lacking only ``producerGroup``, which no client sends).
    """
    for name in _REQUIRED:
        key = _LETTERS[name] if v2 else name
        if key not in fields:
            named = f"<{key}> ({name})" if v2 else f"<{name}>"
            return HeaderError(f"the custom field {named} is null")
    raise AssertionError("no required field is missing")  # pragma: no cover


def _int(fields: Mapping[str, str], key: str, name: str, default: int) -> int:
    """A number of the header (Java parses every one while decoding it); an empty or absent
    one is *default*. A malformed one raises :class:`HeaderError` naming the field by its
    long name, as :func:`~trioha.remoting._codec.int_field` words it."""
    value = fields.get(key)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        return int_field({name: value}, name, default)  # a whole float, or the error


@attrs.frozen(slots=False)  # one per send: cheaper without slots (see store.NewMessage)
class SendMessageHeader:
    """``SendMessageRequestHeader`` (and ``SendMessageRequestHeaderV2``), parsed once.

    Numbers the request leaves empty take the defaults RocketMQ's processor gives them;
    ``default_topic_queue_nums`` is None then (the broker's ``defaultTopicQueueNums``).
    """

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int | None
    #: -1 (or empty): the broker picks a queue.
    queue_id: int
    sys_flag: int
    #: 0 (or empty): the log stamps the message when it stores it.
    born_timestamp: int
    flag: int
    #: ``MessageDecoder.messageProperties2String`` text, as the producer sent it.
    properties: str = ""
    reconsume_times: int = 0
    unit_mode: bool = False
    max_reconsume_times: int = MAX_RECONSUME_TIMES
    #: The body is a batch (``MessageDecoder.encodeMessages``): SEND_BATCH_MESSAGE, or a
    #: SEND_MESSAGE whose ``batch`` says so. The C++ client sends its batches that way; a Java
    #: broker (``Boolean.parseBoolean``) would store the encoded batch as one message's body,
    #: trioha reads it as the batch it is.
    batch: bool = False
    #: trioha reads ``topicSysFlag`` for a topic auto-created by the send.
    topic_sys_flag: int = 0

    @classmethod
    def from_command(cls, command: RemotingCommand) -> SendMessageHeader:
        """The header of a SEND_MESSAGE, SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE.

        The long names are read for SEND_MESSAGE and for a header that has ``topic`` but no
        ``b``, the letters otherwise. Raises :class:`HeaderError` naming the first
        ``@CFNotNull`` field that is missing, or a number that is not one.
        """
        fields = command.ext_fields
        v2 = command.code != RequestCode.SEND_MESSAGE and ("b" in fields or "topic" not in fields)
        if v2:
            if not fields.keys() >= _REQUIRED_V2:
                raise _missing(fields, v2=True)
            get = fields.get
            producer_group, topic, default_topic = fields["a"], fields["b"], fields["c"]
            keys = ("d", "e", "f", "g", "h", "j", "l")
            properties, unit_mode, batch = get("i"), get("k"), get("m")
        else:
            if not fields.keys() >= _REQUIRED_LONG:
                raise _missing(fields, v2=False)
            get = fields.get
            producer_group, topic = fields["producerGroup"], fields["topic"]
            default_topic = fields["defaultTopic"]
            keys = (
                "defaultTopicQueueNums",
                "queueId",
                "sysFlag",
                "bornTimestamp",
                "flag",
                "reconsumeTimes",
                "maxReconsumeTimes",
            )
            properties, unit_mode, batch = get("properties"), get("unitMode"), get("batch")
        if batch is not None and batch != "false":  # what every plain send says
            batch = batch.strip().lower()
        d, e, f, g, h, j, l = map(get, keys)  # noqa: E741 - V2's letters
        try:  # one try for all: a number that is not one is found again below, by name
            numbers = (
                int(d) if d else None,
                int(e or -1),
                int(f or 0),
                int(g or 0),
                int(h or 0),
                int(j or 0),
                int(l or MAX_RECONSUME_TIMES),
            )
        except ValueError:
            numbers = (
                _int(fields, keys[0], "defaultTopicQueueNums", 0) if d else None,
                _int(fields, keys[1], "queueId", -1),
                _int(fields, keys[2], "sysFlag", 0),
                _int(fields, keys[3], "bornTimestamp", 0),
                _int(fields, keys[4], "flag", 0),
                _int(fields, keys[5], "reconsumeTimes", 0),
                _int(fields, keys[6], "maxReconsumeTimes", MAX_RECONSUME_TIMES),
            )
        queue_nums, queue_id, sys_flag, born_timestamp, flag, reconsume_times, max_times = numbers
        return cls(
            producer_group,
            topic,
            default_topic,
            queue_nums,
            queue_id,
            sys_flag,
            born_timestamp,
            flag,
            properties or "",
            reconsume_times,
            unit_mode == "true" or (unit_mode is not None and unit_mode.strip().lower() == "true"),
            max_times,
            command.code == RequestCode.SEND_BATCH_MESSAGE or batch in {"true", "1"},
            _int(fields, "topicSysFlag", "topicSysFlag", 0) if "topicSysFlag" in fields else 0,
        )
