"""Bytes on disk: the only code that opens records or the manifest.

- ``recordio``: the front door for record and manifest I/O (re-exports the writer, the
  reader and the claims): the manifest's bytes, the manifest and run locks.
- ``writer``: the streaming record writer; its section digests overlap the disk's time.
- ``reader``: one header parse, tensors from the file's pages, the sections read verified.
- ``atomic``: the one commit protocol (tmp, fsync, rename or link, directory fsync), a
  finalizer per way of publishing: replace, reserved record, new name, directory.
- ``claims``: name reservations held by ``flock``, leftovers of killed writes, lock files.
- ``safeio``: opens that never follow a planted link, directory fsync, room checks.
- ``digest``: xxh3-128 per section in a record's header; the manifest's digest of a file.
- ``manifest``: the manifest model (entries, every run's points) and its lookups.
- ``journal``: ``manifest.journal``, the changes since ``manifest.json`` was rewritten.
"""
