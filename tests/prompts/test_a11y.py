"""The accessibility tree in the prompt: OSWorld's XML linearised and capped
(``prompts.a11y``), in the user message only when the prompt config asks for it, the same on
the fast path and the processor's own."""

from __future__ import annotations

from dataclasses import replace

from areal.api.cli_args import GenerationHyperparameters

from cua_native.gym.protocol import Screenshot, Task
from cua_native.prompts import PromptBuilder, default_prompt_config
from cua_native.prompts.a11y import CUT, HEADER, INTRO, linearize, prompt_part

from .conftest import png_bytes

ST = "https://accessibility.ubuntu.example.org/ns/state"
CP = "https://accessibility.ubuntu.example.org/ns/component"
TREE = f"""<desktop-frame xmlns:st="{ST}" xmlns:cp="{CP}">
<application name="mousepad">
 <frame name="note.txt - Mousepad" st:showing="true" cp:screencoord="(0, 0)" cp:size="(1024, 768)">
  <menu name="File" st:showing="true" cp:screencoord="(0, 19)" cp:size="(39, 25)"/>
  <menu-item name="Save" cp:screencoord="(0, 40)" cp:size="(80, 20)"/>
  <filler name="" st:showing="true" cp:screencoord="(0, 44)" cp:size="(1024, 700)"/>
  <text name="" st:showing="true" cp:screencoord="(0, 60)" cp:size="(1024, 680)">Dear
   team</text>
 </frame>
</application>
</desktop-frame>"""
GCONFIG = GenerationHyperparameters(max_new_tokens=16)
TASK = Task(task_id="t", instruction="Type Dear team")


def test_on_screen_elements_with_a_name_or_text_one_line_each() -> None:
    assert linearize(TREE, 10_000).splitlines() == [
        HEADER,
        "frame\tnote.txt - Mousepad\t\t(0, 0)\t(1024, 768)",
        "menu\tFile\t\t(0, 19)\t(39, 25)",
        "text\t\tDear team\t(0, 60)\t(1024, 680)",
    ]  # the hidden menu item and the nameless filler are left out


def test_the_budget_cuts_whole_lines() -> None:
    full = linearize(TREE, 10_000)
    cut = linearize(TREE, len(full) - 5)
    assert cut.endswith(CUT) and len(cut) <= len(full) - 5
    assert cut.removesuffix(CUT).splitlines() == full.splitlines()[:-1]
    assert linearize(TREE, 10) == ""
    assert linearize("not xml <", 1000) == "" and prompt_part("<a/>", 1000) is None
    assert prompt_part(TREE, 0) is None and prompt_part(None, 1000) is None


async def test_the_prompt_carries_the_tree_only_when_asked(processor) -> None:
    config = default_prompt_config("qwen3_vl", variant="computer_use")
    shot = Screenshot(png=png_bytes(320, 240), accessibility_tree=TREE)
    off = await PromptBuilder(config, processor).build_turn(TASK, [], shot, GCONFIG)
    assert off.current.accessibility_tree == TREE
    assert "Dear team\t(0, 60)" not in processor.tokenizer.decode(off.input_ids)

    config = replace(config, accessibility_tree_chars=2000)
    fast = PromptBuilder(config, processor)
    slow = PromptBuilder(config, processor, use_processor=True)
    assert fast.fast and not slow.fast
    on = await fast.build_turn(TASK, [], shot, GCONFIG)
    reference = await slow.build_turn(TASK, [], shot, GCONFIG)
    assert on.input_ids == reference.input_ids and on.text == reference.text
    decoded = processor.tokenizer.decode(on.input_ids)
    assert INTRO + HEADER in decoded and "text\t\tDear team\t(0, 60)\t(1024, 680)" in decoded
    # after the screenshot, in the user turn
    assert decoded.index(processor.image_token) < decoded.index(INTRO)
    assert len(on.input_ids) > len(off.input_ids)
