"""What a test's DeepSpeed jobs left in /dev/shm: only the files named by their own ports (other
jobs on this machine create such files at the same time)."""

from __future__ import annotations

from bertforge.pretrain.distributed.shm_buffers import buffers_of_port


def port_of(cmd: list[str]) -> str:
    """The rendezvous port of a launch command (``--master_port P``, as helpers.launch builds)."""
    return cmd[cmd.index("--master_port") + 1]


def left_in_shm(port: str | int) -> list[str]:
    """Names of the DeepSpeed all-reduce buffers of the job on ``port`` still in /dev/shm."""
    return [p.name for p in buffers_of_port(port)]
