"""What a thread handoff costs on one pinned CPU (Python threads, an Event each way), and one system call."""

import os
import threading
import time

os.sched_setaffinity(0, {0})
n = 20000
a = threading.Event()
b = threading.Event()


def worker():
    for _ in range(n):
        a.wait()
        a.clear()
        b.set()


t = threading.Thread(target=worker)
t.start()
c0, w0 = time.process_time_ns(), time.perf_counter_ns()
for _ in range(n):
    a.set()
    b.wait()
    b.clear()
c1, w1 = time.process_time_ns(), time.perf_counter_ns()
t.join()
print(f"handoff pinned: cpu {(c1 - c0) / n / 1e3:.2f} us wall {(w1 - w0) / n / 1e3:.2f} us")
c0 = time.process_time_ns()
for _ in range(200000):
    os.getppid()
print(f"syscall: {(time.process_time_ns() - c0) / 200000 / 1e3:.3f} us")
