"""A job's work dir: the content store its snapshot is built from (blobs.py: uploaded files by digest, shared
by every job that holds them) and the checkpoint folder a job writes and a restart resumes from (checkpoints.py).

Stands on: records.
"""
