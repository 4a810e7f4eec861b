"""The window-state table's values as Faust reads and writes them: ``workflow_state``'s
versioned JSON on the changelog, handed to the stage as decoded."""

from __future__ import annotations

from types import SimpleNamespace

from faust.serializers import codecs

from streams.windows import workflow_state
from streams.windows.workflow_state import WorkflowState

STATE_CODEC = "gpufleet-workflow-state"


class _StateCodec(codecs.Codec):
    """The window-state table's values on its changelog: ``workflow_state``'s versioned JSON
    (a deleted state is JSON null, as Faust's json codec wrote it)."""

    def _dumps(self, obj: WorkflowState | None) -> bytes:
        return b"null" if obj is None else workflow_state.encode(obj)

    def _loads(self, s: bytes) -> WorkflowState | None:
        return None if s == b"null" else workflow_state.decode(s)


codecs.register(STATE_CODEC, _StateCodec())


class StateType:
    """The window-state table's value type as Faust sees it: it takes the serializer of its
    table and changelog from ``_options`` (as from a ``faust.Record``) and hands on what the
    codec decoded as it is."""

    _options = SimpleNamespace(serializer=STATE_CODEC)

    @classmethod
    def from_data(cls, data, *, preferred_type=None):
        return data
