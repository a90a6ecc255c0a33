"""The multi-process flags' check, without jax: rmjax.parallel.distributed runs it as a job starts, and
experiments/job_line.py where a launch reads the job's line (which imports no jax for a sweep)."""

from __future__ import annotations

import re

from rmjax.errors import UsageError


def check_processes(coordinator: str | None, num_processes: int | None, process_id: int | None) -> None:
    """The multi-process settings make one run of num_processes processes, or none is given (also where a launch
    reads the job's line: experiments/job_line.py)."""
    if num_processes is not None and num_processes < 1:
        raise UsageError(f"--num_processes={num_processes}: must be at least 1.")
    if process_id is not None and process_id < 0:
        raise UsageError(f"--process_id={process_id}: must be >= 0 (0 is the process that writes the results).")
    if not coordinator:
        if (num_processes or 1) > 1 or (process_id or 0) > 0:
            given = " ".join(f"--{k}={v}" for k, v in (("num_processes", num_processes), ("process_id", process_id))
                             if v is not None)
            raise UsageError(f"{given} without --coordinator would run one process alone: give "
                             "--coordinator=HOST:PORT (or $RMJAX_COORDINATOR) on every process, or leave them out.")
        return
    if coordinator == "auto":
        if num_processes is not None or process_id is not None:
            raise UsageError("--coordinator=auto lets JAX find the processes and their ids: leave out "
                             "--num_processes/--process_id (or give --coordinator=HOST:PORT).")
        return
    host, _, port = coordinator.rpartition(":")
    if not host or not re.fullmatch(r"[0-9]+", port) or not 0 < int(port) < 65536:
        raise UsageError(f"--coordinator={coordinator}: expected HOST:PORT (e.g. 10.0.0.1:1234) or auto.")
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise UsageError(f"--process_id={process_id} with --num_processes={num_processes}: ids run from 0 to "
                         f"{num_processes - 1}.")
