"""This process's memory, from Linux's /proc/self (shared by the peer benchmarks)."""


def status_kb(field):
    """A field of /proc/self/status in KiB: VmRSS (resident now) or VmHWM (its peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_reset():
    """Starts a peak-memory window: resets the resident high-water mark (Linux 4.0+; where
    that is refused the peak counts from the process start) and returns the resident set in
    bytes."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return status_kb("VmRSS") * 1024


def peak_growth(start):
    """Bytes the resident peak rose above `start` (peak_reset's return)."""
    return status_kb("VmHWM") * 1024 - start
