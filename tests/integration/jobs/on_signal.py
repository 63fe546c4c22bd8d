"""A worker that ends on a signal the way a preemptible job does: its handler writes down the
signal (its checkpoint, say), and it exits 0. No torch: the launcher's handling is what is tried.

    python on_signal.py OUT_DIR     (alone, or as torchrun's worker)

Writes OUT_DIR/ready-<pid> once its handlers are set, then one line per signal to
OUT_DIR/signalled-<pid>, and exits after the one named by EXIT_ON (default: the first).
HANDLE: the signals it handles (comma-separated; default the six a launcher passes on; empty:
none, so a signal does its default action). ORPHAN=1: first leaves an orphan, a grandchild
that writes OUT_DIR/orphan-<pid> and exits at once (a zombie for whoever inherits it).
"""
import os
import signal
import sys
import time

out = sys.argv[1]
me = os.getpid()
names = os.environ.get("HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2")
handled = [signal.Signals[n] for n in names.split(",") if n]
exit_on = os.environ.get("EXIT_ON")


def on_signal(signum, frame):
    name = signal.Signals(signum).name
    with open(os.path.join(out, f"signalled-{me}"), "a") as f:
        f.write(name + "\n")
    if exit_on in (None, name):
        sys.exit(0)


for s in handled:
    signal.signal(s, on_signal)
if os.environ.get("ORPHAN") == "1":
    middle = os.fork()
    if middle == 0:
        middle = os.getpid()
        if os.fork() == 0:   # the grandchild: it waits for its parent to be gone, then exits
            while os.getppid() == middle:
                time.sleep(0.01)
            with open(os.path.join(out, f"orphan-{os.getpid()}"), "w") as f:
                f.write(str(os.getppid()))
            os._exit(0)
        os._exit(0)
    os.waitpid(middle, 0)
with open(os.path.join(out, f"ready-{me}"), "w") as f:
    f.write(os.environ.get("RANK", ""))
deadline = time.time() + 120   # bounded: a test that never signals it does not leave it behind
while time.time() < deadline:
    time.sleep(0.05)
sys.exit(3)
