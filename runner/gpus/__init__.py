"""The box's GPUs: what NVML says of each (devices.py), each job's GPU memory and load over its life (history.py),
and the leases a scheduling pass claims for the jobs it starts (claims.py). The lease itself, held by each job's
shim for the job's life, is runner/shim/gpulease.py.

Stands on: records, shim.
"""
