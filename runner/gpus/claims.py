"""The GPU leases a scheduling pass claims (runner/shim/gpulease.py) for the jobs it starts.

A pass with GPU jobs to place first reads who holds each GPU outside the daemon (for the waiting jobs' reasons);
then, as it places each job, it claims the leases of the devices it picks, so that no other daemon hands them out,
and a device found leased meanwhile is passed over, saying by whom. The job's shim takes each claim over with a
lease of its own (LEASES_ENV names the claims), and the pass lets its claims go once the shim has started, or
at its end at the latest: a lease is held without a gap from the claim to the job's end.

Every look at the shared folder runs in a thread: it cannot block (O_NONBLOCK throughout), but a folder that
someone filled with files takes time to read, and the event loop serves every client meanwhile.
"""

from __future__ import annotations

import asyncio
import os
from typing import Union

from ..shim import gpulease
from .devices import held_outside, lease_folder, lease_keys, read_gpu_memory


class Claims:
    """The leases one pass holds for the jobs it starts, by device; the lease key of each device in the pass."""

    def __init__(self) -> None:
        self._keys: dict[str, str] = {}
        self._held: dict[str, gpulease.Lease] = {}

    async def look(self, devices: list[str], candidates: list[str]) -> dict[str, str]:
        """At a pass's start: which of `devices` have a lease (the GPUs NVML lists), and who holds each of the
        `candidates` outside this daemon, in words."""
        loop = asyncio.get_running_loop()
        readings = await loop.run_in_executor(None, read_gpu_memory)
        self._keys = lease_keys(devices, readings)
        if not self._keys:
            return {}
        return await loop.run_in_executor(None, held_outside, candidates, readings)

    async def take(self, free: list[str], need: int) -> tuple[list[str], dict[str, str]]:
        """`need` of the `free` devices, in their order, with their leases claimed for this daemon ([] if fewer
        could be: none is kept then), and who holds each of those found leased meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(None, self._take, free, need)

    def env(self, devices: list[str]) -> dict[str, str]:
        """What a job started on `devices` is given so that its shim takes the claims over."""
        paths = [self._held[device].path for device in devices if device in self._held]
        return {gpulease.LEASES_ENV: os.pathsep.join(paths)} if paths else {}

    def let_go(self, devices: list[str]) -> None:
        """Release the claims on `devices` (those it holds): their job's shim holds its own, or it did not start."""
        for device in devices:
            lease = self._held.pop(device, None)
            if lease is not None:
                gpulease.release(lease)

    def let_go_all(self) -> None:
        self.let_go(list(self._held))

    def _take(self, free: list[str], need: int) -> tuple[list[str], dict[str, str]]:
        taken: list[str] = []
        lost: dict[str, str] = {}
        for device in free:
            if len(taken) == need:
                break
            key = self._keys.get(device)
            found = None if key is None else _claim(key)
            if isinstance(found, str):
                lost[device] = found
                continue
            if found is not None:
                self._held[device] = found
            taken.append(device)
        if len(taken) < need:
            self.let_go(taken)
            return [], lost
        return taken, lost


def _claim(key: str) -> Union[gpulease.Lease, str]:
    """The lease of the GPU `key` for this daemon, or who holds it (or what is wrong with the folder), in words."""
    try:
        found = gpulease.claim(lease_folder(), key)
    except gpulease.LeaseError as exc:
        return str(exc)
    return gpulease.describe(found) if isinstance(found, gpulease.Holder) else found
