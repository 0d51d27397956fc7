"""The POSTs' watchdog (``workerproc/posting.py::Watchdog``): one thread that shuts a POST's
sockets at its deadline. Arming a deadline no sooner than what the thread already sleeps
towards (a POST's, seconds away) does not wake it: it woke twice per POST, the delivery's
hottest path. A sooner deadline armed after a later one still fires on time."""

from __future__ import annotations

import threading
import time

from helpers import wait_for

from workerproc.posting import Watchdog


class Counting(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_arming_a_later_deadline_leaves_the_thread_asleep_and_a_sooner_one_still_fires() -> None:
    dog = Watchdog()
    lock = dog._lock = Counting()
    fired: list[str] = []
    first = dog.arm(time.monotonic() + 30, lambda: fired.append("first"))
    wait_for(lambda: dog._thread is not None and dog._thread.is_alive(), timeout=10,
             what="the watchdog's thread")  # fmt: skip
    notified = lock.notified
    for _ in range(100):  # a POST each: armed 10 s ahead, answered, disarmed
        dog.disarm(dog.arm(time.monotonic() + 10, lambda: fired.append("late")))
    assert lock.notified == notified, "no wake-up for deadlines seconds away"
    began = time.monotonic()
    dog.arm(time.monotonic() + 0.2, lambda: fired.append("soon"))
    wait_for(lambda: "soon" in fired, timeout=10, what="the sooner deadline's callback")
    assert time.monotonic() - began < 5
    dog.disarm(first)
    assert fired == ["soon"]
