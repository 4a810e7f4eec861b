"""Every record gpufleet puts on a topic, each written once in a module of its own as a field
list with the version each field came in (``schemas.fields``); a new version's ``.avsc`` is made
from it, a released one is held to it (``python -m schemas.generate``). In the order their first
versions were released."""

from __future__ import annotations

from schemas.fields import Record
from schemas.records.alert import ALERT
from schemas.records.dead_letter import DEAD_LETTER
from schemas.records.enforcement_event import ENFORCEMENT_EVENT
from schemas.records.finding import FINDING
from schemas.records.gpu_sample import GPU_SAMPLE
from schemas.records.gpu_sample_batch import GPU_SAMPLE_BATCH
from schemas.records.gpu_sample_columns import GPU_SAMPLE_COLUMNS
from schemas.records.host_sample import HOST_SAMPLE
from schemas.records.kernel_event import KERNEL_EVENT
from schemas.records.kernel_event_columns import KERNEL_EVENT_COLUMNS
from schemas.records.owner_action import OWNER_ACTION
from schemas.records.partition_clock import PARTITION_CLOCK
from schemas.records.profile_request import PROFILE_REQUEST
from schemas.records.profile_result import PROFILE_RESULT
from schemas.records.profile_status import PROFILE_STATUS
from schemas.records.schedule_report import SCHEDULE_REPORT
from schemas.records.serving_sample import SERVING_SAMPLE
from schemas.records.serving_window import SERVING_WINDOW
from schemas.records.trace_analysis import TRACE_ANALYSIS
from schemas.records.trace_end import TRACE_END
from schemas.records.unobserved_time import UNOBSERVED_TIME
from schemas.records.workflow_event import WORKFLOW_EVENT
from schemas.records.workflow_summary import WORKFLOW_SUMMARY
from schemas.records.workflow_window import WORKFLOW_WINDOW

RECORDS: tuple[Record, ...] = (
    GPU_SAMPLE,
    WORKFLOW_WINDOW,
    ALERT,
    DEAD_LETTER,
    KERNEL_EVENT,
    TRACE_END,
    TRACE_ANALYSIS,
    FINDING,
    HOST_SAMPLE,
    WORKFLOW_EVENT,
    WORKFLOW_SUMMARY,
    GPU_SAMPLE_BATCH,
    PROFILE_REQUEST,
    PROFILE_STATUS,
    PROFILE_RESULT,
    SCHEDULE_REPORT,
    GPU_SAMPLE_COLUMNS,
    PARTITION_CLOCK,
    ENFORCEMENT_EVENT,
    KERNEL_EVENT_COLUMNS,
    UNOBSERVED_TIME,
    OWNER_ACTION,
    SERVING_SAMPLE,
    SERVING_WINDOW,
)
BY_NAME = {r.name: r for r in RECORDS}
