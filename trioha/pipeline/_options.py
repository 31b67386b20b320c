"""The data source's options, parsed once on the driver into a frozen value.

Pure Python, so that option errors are tested without Spark and read the same everywhere.
Spark hands options over as strings with case-insensitive names.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from trioha._errors import PipelineError
from trioha.pipeline._plan import DEFAULT_PARTITION_BYTES, MIB, ScanPartition, plan_partitions


class Output(enum.Enum):
    """What a read returns: one row per message, or one row per damaged region."""

    MESSAGES = "messages"
    PROBLEMS = "problems"


class Engine(enum.Enum):
    """Who decodes a read: ``auto`` picks ``jvm`` when the session has the JVM engine's jar
    and the read is one it does, else ``python`` (:mod:`trioha.pipeline._jvm`)."""

    AUTO = "auto"
    JVM = "jvm"
    PYTHON = "python"

    @classmethod
    def parse(cls, text: str | Engine) -> Engine:
        if isinstance(text, Engine):
            return text
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise PipelineError(f"engine={text!r}: expected auto, jvm or python") from None


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@attrs.frozen
class ReadOptions:
    """Everything a read needs besides the partition (picklable, sent to every task).

    ``path`` is a store root or a commitlog directory; ``start_offset``/``end_offset``
    select the records whose physical offset lies in ``[start, end)``.
    """

    path: str
    output: Output = Output.MESSAGES
    start_offset: int | None = None
    end_offset: int | None = None
    partition_bytes: int = DEFAULT_PARTITION_BYTES
    segment_size: int | None = None
    verify_crc: bool = True
    decompress: bool = False
    arrow: bool = True
    batch_rows: int = 16384
    batch_bytes: int = 32 * MIB
    engine: Engine = Engine.AUTO

    def plan(self) -> tuple[ScanPartition, ...]:
        """The read's partitions, planned here (on the driver) by both engines alike."""
        from trioha.pipeline._layout import read_layout

        return plan_partitions(
            read_layout(self.path, segment_size=self.segment_size),
            target_bytes=self.partition_bytes,
            start_offset=self.start_offset,
            end_offset=self.end_offset,
        )

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], *, output: Output | None = None
    ) -> ReadOptions:
        """Parse Spark's string options; *output* forces the output (second format name)."""
        lower = {k.lower(): v for k, v in options.items()}
        known = {
            "path",
            "output",
            "startoffset",
            "endoffset",
            "partitionbytes",
            "segmentsize",
            "verifycrc",
            "decompress",
            "arrow",
            "batchrows",
            "batchbytes",
            "engine",
        }
        unknown = sorted(set(lower) - known)
        if unknown:
            raise PipelineError(
                f"unknown commitlog option(s) {', '.join(unknown)}; known: "
                "path, output, startOffset, endOffset, partitionBytes, segmentSize, "
                "verifyCrc, decompress, arrow, batchRows, batchBytes, engine"
            )
        path = lower.get("path")
        if not path:
            raise PipelineError(
                'no path: use spark.read.format("commitlog").load("/store/root or commitlog dir")'
            )
        if output is None:
            text = lower.get("output", Output.MESSAGES.value).lower()
            try:
                output = Output(text)
            except ValueError:
                raise PipelineError(
                    f"option output={text!r}: expected 'messages' or 'problems'"
                ) from None
        engine = Engine.parse(lower.get("engine", Engine.AUTO))
        start = _int(lower, "startoffset", minimum=0)
        end = _int(lower, "endoffset", minimum=0)
        if start is not None and end is not None and end < start:
            raise PipelineError(f"endOffset {end} is before startOffset {start}")
        return cls(
            path=path,
            output=output,
            start_offset=start,
            end_offset=end,
            partition_bytes=_int(lower, "partitionbytes", minimum=1) or DEFAULT_PARTITION_BYTES,
            segment_size=_int(lower, "segmentsize", minimum=1),
            verify_crc=_bool(lower, "verifycrc", default=True),
            decompress=_bool(lower, "decompress", default=False),
            arrow=_bool(lower, "arrow", default=True),
            batch_rows=_int(lower, "batchrows", minimum=1) or 16384,
            batch_bytes=_int(lower, "batchbytes", minimum=1) or 32 * MIB,
            engine=engine,
        )


def _int(options: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    text = options.get(name)
    if text is None:
        return None
    try:
        value = int(str(text).strip())
    except ValueError:
        raise PipelineError(f"option {name}={text!r} is not an integer") from None
    if value < minimum:
        raise PipelineError(f"option {name}={value} must be at least {minimum}")
    return value


def _bool(options: Mapping[str, str], name: str, *, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    low = str(text).strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise PipelineError(f"option {name}={text!r} is not a boolean (true/false)")
