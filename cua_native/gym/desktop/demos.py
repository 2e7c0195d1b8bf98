"""The scripted demonstrator of the shipped desktop tasks: canonical actions per task, each
solving it on the real app (``tests/gym/desktop`` runs every one and checks the evaluator).

A step is an action, or a ``WaitForWindow`` — the demonstrator reads the desktop's windows (as
an agent reads the screen) before typing into a dialog that opens asynchronously. It proves each
task solvable and gives warm-start demonstrations.
"""

from __future__ import annotations

from dataclasses import dataclass

from cua_native.actions.models import Action, Key, TypeText
from cua_native.gym.desktop.gym import DesktopExecution
from cua_native.gym.desktop.tasks import wait_for_window


@dataclass(frozen=True, slots=True)
class WaitForWindow:
    """Wait (bounded) until a window whose title contains ``name`` exists, and activate it."""

    name: str


Step = Action | WaitForWindow

DEMONSTRATIONS: dict[str, tuple[Step, ...]] = {
    "terminal_hello_file": (TypeText(text="echo hello desktop > ~/hello.txt\n"),),
    "terminal_make_directory": (TypeText(text="mkdir ~/projects\n"),),
    "editor_save_note": (TypeText(text="Dear team"), Key(keys=["ctrl", "s"])),
    "editor_save_unicode": (TypeText(text="Grüße aus Köln"), Key(keys=["ctrl", "s"])),
    "files_new_folder": (
        Key(keys=["ctrl", "shift", "n"]),
        WaitForWindow("Creating New Folder"),
        TypeText(text="reports\n"),
    ),
    "calculator_product_to_clipboard": (TypeText(text="12*34="), Key(keys=["ctrl", "c"])),
    "calc_formula_cell": (TypeText(text="=6*7\n"), Key(keys=["ctrl", "s"])),
    "calc_text_cell": (
        Key(keys=["right"]),
        Key(keys=["down"]),
        TypeText(text="Total\n"),
        Key(keys=["ctrl", "s"]),
    ),
}


class DemonstrationFailed(RuntimeError):
    """The desktop refused a demonstrated action."""


async def demonstrate(execution: DesktopExecution, *, window_timeout_s: float = 60.0) -> None:
    """Play the task's demonstration on ``execution``; raises ``KeyError`` for a task without
    one and ``DemonstrationFailed`` when an action is refused."""
    for step in DEMONSTRATIONS[execution.task.task_id]:
        if isinstance(step, WaitForWindow):
            await wait_for_window(execution.client, step.name, limit_s=window_timeout_s)
            continue
        result = await execution.act(step)
        if not result.ok:
            raise DemonstrationFailed(f"{execution.task.task_id}: {step!r}: {result.error}")
