"""The scripted demonstrator of the shipped desktop tasks: canonical actions per task, each
solving it on the real app (``tests/gym/desktop`` runs every one and checks the evaluator).

A step is an action, or a ``WaitForWindow`` — the demonstrator reads the desktop's windows (as
an agent reads the screen) before typing into a dialog that opens asynchronously. It proves each
task solvable and gives warm-start demonstrations.
"""

from __future__ import annotations

from dataclasses import dataclass

from cua_native.actions.models import Action, Answer, Key, Terminate, TypeText
from cua_native.gym.desktop.gym import DesktopExecution
from cua_native.gym.desktop.tasks import wait_for_window
from cua_native.gym.protocol import final_answer


@dataclass(frozen=True, slots=True)
class WaitForWindow:
    """Wait (bounded) until a window whose title contains ``name`` exists, and activate it."""

    name: str


Step = Action | WaitForWindow

_SAVE = Key(keys=["ctrl", "s"])
_HOME = Key(keys=["ctrl", "home"])


def _shell(command: str) -> tuple[Step, ...]:
    """A terminal task: type the command and run it."""
    return (TypeText(text=command + "\n"),)


def _new_folder(name: str) -> tuple[Step, ...]:
    """pcmanfm's New Folder dialog (ctrl+shift+n), its name typed once the dialog is up."""
    return (
        Key(keys=["ctrl", "shift", "n"]),
        WaitForWindow("Creating New Folder"),
        TypeText(text=name + "\n"),
    )


def _calculator(keys: str) -> tuple[Step, ...]:
    """galculator: one key per action (typed in one go, a repeated digit such as 144's second
    4 is lost), then copy the display."""
    return (*(TypeText(text=key) for key in keys), Key(keys=["ctrl", "c"]))


def _cell(column: int, row: int, text: str) -> tuple[Step, ...]:
    """LibreOffice Calc: from A1 to the cell ``column`` right and ``row`` down (0-based), enter
    ``text`` there and save."""
    moves = [Key(keys=["right"])] * column + [Key(keys=["down"])] * row
    return (_HOME, *moves, TypeText(text=text + "\n"), _SAVE)


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
    "calculator_product_to_clipboard": _calculator("12*34="),
    "calc_formula_cell": (TypeText(text="=6*7\n"), Key(keys=["ctrl", "s"])),
    "calc_text_cell": (
        Key(keys=["right"]),
        Key(keys=["down"]),
        TypeText(text="Total\n"),
        Key(keys=["ctrl", "s"]),
    ),
    "terminal_copy_file": _shell("cp ~/data/report.txt ~/backup/"),
    "terminal_rename_file": _shell("mv ~/draft.txt ~/final.txt"),
    "terminal_delete_logs": _shell("rm ~/logs/*.log"),
    "terminal_count_lines": _shell("wc -l < ~/names.txt > ~/count.txt"),
    "terminal_sort_file": _shell("sort ~/fruits.txt > ~/sorted.txt"),
    "terminal_make_executable": _shell("chmod +x ~/run.sh"),
    "terminal_append_line": _shell("echo 'call mom' >> ~/todo.txt"),
    "terminal_uppercase": _shell("tr a-z A-Z < ~/shout.txt > ~/loud.txt"),
    "terminal_symlink": _shell("ln -s ~/logs2026 ~/latest"),
    "terminal_archive": _shell("cd ~ && tar czf docs.tar.gz docs"),
    "terminal_python_power": _shell("python3 -c 'print(2**20)' > ~/power.txt"),
    "terminal_replace_text": _shell("sed -i s/red/blue/ ~/config.txt"),
    "editor_append_line": (Key(keys=["ctrl", "end"]), TypeText(text="pears"), _SAVE),
    "editor_clear_file": (Key(keys=["ctrl", "a"]), Key(keys=["delete"]), _SAVE),
    "editor_two_lines": (TypeText(text="roses are red\nviolets are blue"), _SAVE),
    "editor_replace_text": (Key(keys=["ctrl", "a"]), TypeText(text="Final"), _SAVE),
    "files_new_folder_in_subdir": _new_folder("2026"),
    "files_new_folder_spaces": _new_folder("tax returns"),
    "calculator_sum_to_clipboard": _calculator("1234+5678="),
    "calculator_quotient_to_clipboard": _calculator("144/12="),
    "calculator_difference_to_clipboard": _calculator("1000-1="),
    "calc_sum_column": _cell(0, 3, "=SUM(A1:A3)"),
    "calc_average_column": _cell(1, 0, "=AVERAGE(A1:A3)"),
    "calc_product_cells": _cell(2, 0, "=A1*B1"),
    "calc_header_row": (_HOME, TypeText(text="Name\tAge\n"), _SAVE),
    "calc_total_price": _cell(1, 4, "=SUM(B2:B4)"),
    # OSWorld's infeasible tasks: the only right move is to declare them impossible
    "terminal_infeasible_camera": (Terminate(status="failure"),),
    "editor_infeasible_video": (Terminate(status="failure"),),
    "files_infeasible_cloud": (Terminate(status="failure"),),
    "calculator_infeasible_plot": (Terminate(status="failure"),),
}


class DemonstrationFailed(RuntimeError):
    """The desktop refused a demonstrated action."""


async def demonstrate(execution: DesktopExecution, *, window_timeout_s: float = 60.0) -> str | None:
    """Play the task's demonstration on ``execution``; the answer ``evaluate`` takes
    (``protocol.final_answer`` of a closing ``answer``/``terminate``, else ``None``). Raises
    ``KeyError`` for a task without one and ``DemonstrationFailed`` when an action is refused."""
    for step in DEMONSTRATIONS[execution.task.task_id]:
        if isinstance(step, WaitForWindow):
            await wait_for_window(execution.client, step.name, limit_s=window_timeout_s)
            continue
        if isinstance(step, Answer | Terminate):
            return final_answer(step)
        result = await execution.act(step)
        if not result.ok:
            raise DemonstrationFailed(f"{execution.task.task_id}: {step!r}: {result.error}")
    return None
