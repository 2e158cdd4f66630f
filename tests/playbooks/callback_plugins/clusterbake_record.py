"""Record every task result of a run as JSON (for tests/unit/test_gpu_roles.py).

Enabled with ANSIBLE_CALLBACKS_ENABLED=clusterbake_record; writes the list of
{task, role, status, result} to the file named by CLUSTERBAKE_RECORD_FILE.
"""

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: clusterbake_record
type: aggregate
short_description: record task results as JSON for the tests
description: Writes every task result to the file named by CLUSTERBAKE_RECORD_FILE.
requirements: [enable in configuration]
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "clusterbake_record"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.records = []

    def _record(self, status, result):
        task = getattr(result, "task", None) or result._task
        data = getattr(result, "result", None)
        if data is None:
            data = result._result
        role = task._role.get_name() if task._role else None
        self.records.append({"task": task.get_name(), "role": role, "status": status, "result": data})

    def v2_runner_on_ok(self, result):
        self._record("ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record("failed", result)

    def v2_runner_on_skipped(self, result):
        self._record("skipped", result)

    def v2_playbook_on_stats(self, stats):
        with open(os.environ["CLUSTERBAKE_RECORD_FILE"], "w") as handle:
            json.dump(self.records, handle, indent=1, default=str)
