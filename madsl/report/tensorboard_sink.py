"""Records as TensorBoard event files, with tensorboard's own protobufs and record writer (the
`tensorboard` extra; no TensorFlow).

A record is one TensorBoard run: the folder `<DIR>/<record name>` holding one event file,
`events.out.tfevents.<start>.madsl.<digest>`, built whole in memory and written atomically
(madsl.outputs.write_bytes_atomic). It holds the curves as scalars (step: the epoch, or a
pretraining run's optimizer step), the final scores at the last step, the config as a text panel
and as hyperparameters (TensorBoard's HParams dashboard filters and groups runs by them and by
the tags). A file with the record's digest already there is current: nothing is written. An older
file of madsl's in the folder (another digest, or a live reporter's) is removed once the new one
is in place; nothing else there is touched.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from madsl.report.records import Record

MARK = ".madsl."  # in the name of every event file madsl writes


def _modules() -> Any:
    from madsl.errors import MadslError

    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
        from tensorboard.plugins.hparams import summary_v2 as hparams
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError as err:
        raise MadslError(
            f"TensorBoard export needs the tensorboard package ({err})",
            hint="pip install 'madsl[tensorboard]'",
        ) from None
    return event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2, hparams, RecordWriter


def event_file_name(record: Record) -> str:
    return f"events.out.tfevents.{int(record.start)}{MARK}{record.digest[:16]}"


def _hparam(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def event_bytes(record: Record, text: str) -> bytes:
    """The record's event file, whole."""
    event_pb2, summary_pb2, tensor_pb2, shape_pb2, types_pb2, hparams, RecordWriter = _modules()
    buffer = io.BytesIO()
    writer = RecordWriter(buffer)

    def write(step: int, wall: float, summary: Any = None, **kwargs: Any) -> None:
        event = event_pb2.Event(wall_time=wall, step=step, summary=summary, **kwargs)
        writer.write(event.SerializeToString())

    def scalars(values: dict[str, float]) -> Any:
        return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()])

    write(0, record.start, file_version="brain.Event:2")
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING, string_val=[text.encode()], tensor_shape=shape_pb2.TensorShapeProto()
    )
    write(
        0,
        record.start,
        summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="config", metadata=meta, tensor=tensor)]),
    )
    values = {**{k: _hparam(v) for k, v in record.config.items() if v is not None}, **record.tags}
    write(0, record.start, hparams.hparams_pb(values, trial_id=record.key))
    for step, wall, metrics in record.curves:
        if metrics:
            write(step, wall, scalars(metrics))
    if record.finals:
        last = record.curves[-1][0] if record.curves else 0
        write(last, record.end, scalars(record.finals))
    return buffer.getvalue()


class TensorBoardSink:
    """Syncs records into a TensorBoard log folder (a folder per record)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        _modules()  # the extra is there, or a clear error before anything is written

    def sync(self, record: Record, text: str) -> bool:
        """Write the record's event file unless it is there already; True where it wrote."""
        from madsl.outputs import write_bytes_atomic

        run_dir = self.folder / record.name
        target = run_dir / event_file_name(record)
        if target.is_file():
            return False
        run_dir.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(target, event_bytes(record, text))
        for old in run_dir.glob("events.out.tfevents.*"):
            if MARK in old.name and old.name != target.name and old.is_file() and not old.is_symlink():
                old.unlink()
        return True

    def close(self) -> None: ...
