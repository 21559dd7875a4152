"""TFRecord files of `tf.train.Example` protos, written and read without TensorFlow.

Importing TensorFlow costs seconds and hundreds of MB, and a per-row Python loop over
`tf.train.Example` is the slowest part of serialization, so this module builds the proto
wire bytes with numpy and frames them itself. The files are ordinary TFRecords: TF's
`TFRecordDataset` + `parse_example` read them, and the reader here reads TF's files.
`decode_tfrecord_file` reads a whole file at once: runs of equal-length records (as written
here) decode as strided numpy views of the file's bytes; anything else record by record.
Fixed-width bytes values (``bytes_keys``) come back as (n, bytes) uint8 rows, for the caller to
view as the dtype they hold.

Wire layout written for every record (keys sorted by name, as protobuf's deterministic
serialization does)::

    Example    = 0x0a len(Features) Features
    Features   = { 0x0a len(entry) entry }                     one entry per key
    entry      = 0x0a len(key) key 0x12 len(Feature) Feature
    Feature    = 0x1a len(list) Int64List | 0x12 len(list) FloatList | 0x0a len(list) BytesList
    *List      = 0x0a len(payload) payload                     omitted when empty
    payload    = varints (int64, two's complement) | float32 little-endian
               | one bytes value: the row's values little-endian (a bytes feature, e.g. int8,
                 float16 or bfloat16 feature rows as stored; TF: parse as tf.string, then
                 tf.io.decode_raw(value, the stored dtype))

TFRecord framing: uint64 LE length, masked crc32c of those 8 bytes (uint32 LE), data,
masked crc32c of data (uint32 LE).
"""

from components.tfrecord.decode import decode_examples, decode_tfrecord_file
from components.tfrecord.encode import TFRecordWriter, encode_examples
from components.tfrecord.framing import frame_record, iter_records

__all__ = ["TFRecordWriter", "decode_examples", "decode_tfrecord_file", "encode_examples", "frame_record", "iter_records"]
