"""Bytes on disk: the only code that opens records or the manifest.

- ``recordio``: the front door for record and manifest I/O (re-exports the writer, the
  reader and the claims): the manifest's bytes, the manifest and run locks.
- ``writer``: the streaming record writer; its section digests overlap the disk's time.
- ``reader``: an open record file (``RecordFile``), read either way, the sections read verified.
- ``record_header``: a record file's header parsed once and checked; the refusals readers share.
- ``section_check``: the bytes read checked against the header's section digests (or whole).
- ``mapped_read``: tensors made from the file's mapped pages, the kernel kept reading ahead.
- ``streamed_read``: pieces read into two reused buffers (averaging, verify).
- ``atomic``: the one commit protocol (tmp, fsync, rename or link, directory fsync), a
  finalizer per way of publishing: replace, reserved record, new name, directory.
- ``claims``: name reservations held by ``flock``, leftovers of killed writes, lock files.
- ``safeio``: opens that never follow a planted link, directory fsync, room checks.
- ``digest``: xxh3-128 per section in a record's header; the manifest's digest of a file.
- ``manifest``: the manifest model (entries, every run's points) and its lookups.
- ``journal``: ``manifest.journal``, the changes since ``manifest.json`` was rewritten.
"""
