"""Bytes on disk: the only code that opens records or the manifest.

- ``recordio``: the streaming safetensors writer and reader with inline sha256, headers,
  the manifest's bytes, the manifest and run locks, leftovers set aside.
- ``claims``: the commit protocol (tmp, fsync, rename, directory fsync) and name
  reservations held by ``flock``; published files never overwrite.
- ``safeio``: opens that never follow a planted link, directory fsync, room checks.
- ``digest``: the header's digest of a record's tensor bytes.
- ``manifest``: the manifest model (entries, every run's points) and its lookups.
"""
