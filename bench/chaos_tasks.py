"""The chaos harness's task: a side effect that leaves a trace of every execution.

Each run appends two short lines to one per-run file, opened with O_APPEND (one write()
of a short line is atomic against other appenders) and fsync'd:

    S <job_id> <seq> <attempt> <worker_id> <worker_pid> <task_pid> <time>   run started
    E <job_id> <seq> <attempt> <worker_id> <worker_pid> <task_pid> <time>   side effect done

An "E" line is the side effect: a job with two "E" lines had its effect twice. A run killed
between its "S" and its "E" left no effect. bench/chaos.py reads the file afterwards.
The module lives at the top level of bench/ so that workers started from the repository
root import it by reference.
"""

import os
import random
import time

from zktasks import zk_task


def append_line(path: str, line: str, durable: bool = True) -> None:
    """Append one line atomically (O_APPEND, one write) and make it durable (fsync;
    `durable=False` for chaos.py --no-fsync: the harness kills processes, never the
    machine, and what write() took survives a killed process)."""
    data = line.encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"short append to {path}: {written} of {len(data)} bytes")
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


@zk_task(takes_context=True)
def record_side_effect(context, path, seq, min_ms=10, max_ms=200, cooperative=False,
                       stall_share=0.0, stall_ms=0, durable=True):
    """Record the start, sleep a little (so kills land mid-job), record the effect.

    `stall_share` of the runs sleep `stall_ms` instead (chaos.py --stalls): with short
    jobs, a long one in a batch, whose jobs behind it are taken back from its task
    process (zktasks.executor.BATCH_PATIENCE_S).

    `cooperative` (chaos.py --cooperative): before the effect, stop with JobCancelled if
    zktasks.cancel_requested() says so, as a task that checks it would (a worker whose
    session expired asks its runs to stop; their jobs are handed back).
    """
    result = context.task_result
    attempt = context.attempt
    worker_id = result.worker_ids[-1] if result.worker_ids else "?"
    fields = f"{result.id} {seq} {attempt} {worker_id} {os.getppid()} {os.getpid()}"
    append_line(path, f"S {fields} {time.time():.6f}\n", durable)
    # Deterministic per (job, attempt): a rerun sleeps its own time.
    draw = random.Random(f"{result.id}/{attempt}")
    pause = draw.uniform(min_ms, max_ms) / 1000
    if draw.random() < stall_share:
        pause = stall_ms / 1000
    time.sleep(pause)
    if cooperative:
        from zktasks import JobCancelled, cancel_requested

        if cancel_requested():
            raise JobCancelled("asked to stop before the effect")
    done = time.time()
    append_line(path, f"E {fields} {done:.6f}\n", durable)
    return {"job_id": result.id, "seq": seq, "attempt": attempt, "worker_id": worker_id,
            "worker_pid": os.getppid(), "task_pid": os.getpid(), "done_at": done}
