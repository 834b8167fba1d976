"""Checkpoints in object storage, as the daemon and the client both see them (docs/how-to/checkpoints.md).

1. place.py: where a job's checkpoints are stored (`s3://bucket/prefix`), checked as the user typed it
2. credentials.py: the credentials and endpoint, from where AWS's own tools look for them
3. remote.py: one bucket through obstore (Rust's object_store): put, verify, get, list, delete; errors in one line
4. stored.py: what a stored job holds: each checkpoint's manifest, the job's record, and restoring one

A job's stored folder keeps its checkpoint folder's layout (`ckpt-5.index` stays `ckpt-5.index`); beside it,
`.tfrun/` holds one manifest per checkpoint, written only once every file of it was uploaded and verified, so
a checkpoint counts in storage exactly when its manifest is there.
"""
