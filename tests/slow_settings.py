"""tests.settings, taking SLOW_SETUP_SECONDS to import: a task process that is slow to set
up Django (test_task_process_batches.py)."""

import os
import time

from tests.settings import *  # noqa: F403

time.sleep(float(os.environ.get("SLOW_SETUP_SECONDS", "0")))
