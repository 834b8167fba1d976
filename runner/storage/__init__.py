"""Checkpoints copied to object storage by the daemon (docs/how-to/checkpoints.md): `complete.py` decides when a
checkpoint in a job's folder is complete, `uploader.py` sends each one once, durably, and `restore.py` fetches a job's
newest stored checkpoint before it starts on another box. What both sides share (the destination, credentials,
the bucket through obstore, the manifests) is tfrun/storage/."""
