"""Whether a process still runs, read from /proc without racing its exit."""


def process_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an unreaped child runs nothing).

    The process can exit and be reaped between opening /proc/PID/stat and reading it:
    the read then fails with ESRCH (ProcessLookupError), not FileNotFoundError. Both
    mean it is gone.
    """
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
