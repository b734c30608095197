"""Job ids: UUIDv7 (RFC 9562), time-ordered, made in bulk.

Random version-4 ids scatter every insert across the primary key and the
``(job, seq)`` event index, so a big table's writes touch a random page
each; v7 ids start with the millisecond, so a batch lands on the right edge
of both (and ``jobs.partitions`` can range-partition events by job id).
"""

from __future__ import annotations

import os
import time
import uuid

_UUID = uuid.UUID
_new_uuid = _UUID.__new__
_set = object.__setattr__
_UNKNOWN = uuid.SafeUUID.unknown  # read once: an enum member lookup is a Python-level call
_VARIANT = 0x8000 << 48  # RFC 9562 variant bits (10) at the top of octet 8
_LOW_62 = (1 << 62) - 1


def new_job_ids(n: int) -> list[uuid.UUID]:
    """``n`` distinct, time-ordered job ids (UUIDv7, RFC 9562), ascending.

    A batch shares its millisecond and counts up from a random 74-bit start
    (RFC 9562's "monotonic random"), which keeps it ordered. One
    ``os.urandom`` call and no ``UUID.__init__`` parsing per id.
    """
    ms = time.time_ns() // 1_000_000
    start = int.from_bytes(os.urandom(10)) >> 7  # 73 random bits: start + n fits in 74
    head = (ms & 0xFFFF_FFFF_FFFF) << 80 | 7 << 76
    head |= _VARIANT
    out: list[uuid.UUID] = []
    append = out.append
    for counter in range(start, start + n):
        value = _new_uuid(_UUID)
        # 12 bits of the counter go after the version, 62 after the variant.
        _set(value, "int", head | (counter >> 62) << 64 | counter & _LOW_62)
        _set(value, "is_safe", _UNKNOWN)
        append(value)
    return out
