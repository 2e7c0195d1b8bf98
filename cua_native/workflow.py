"""Compatibility path: ``workflow: cua_native.workflow.CUAAgentWorkflow`` in existing AReaL configs.

The workflow lives in :mod:`cua_native.rollout.workflow`; this module only re-exports it.
"""

from cua_native.rollout.workflow import CUAAgentWorkflow, workflow_kwargs

__all__ = ["CUAAgentWorkflow", "workflow_kwargs"]
