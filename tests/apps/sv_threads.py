"""An app whose import starts a thread: the supervisor must refuse to fork from it."""

from __future__ import annotations

import threading
import time

from workerproc import App

app = App()
threading.Thread(target=time.sleep, args=(30,), name="metrics-pusher", daemon=True).start()
